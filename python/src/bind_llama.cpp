// flashcache._llama: the llama.cpp adapter's ContextManager on a llama_context that
// llama-cpp-python made (flashcache.llama_cpp is its public face).
//
// The module links the libllama of the llama-cpp-python package it was built against.
// llama_cpp loads that library first (RTLD_GLOBAL), and the dynamic loader then gives this
// module the same copy: one libllama in the process. library_path() names the file this
// module's llama_* symbols come from, so that Python can refuse a mismatch by name.
#include <dlfcn.h>
#include <llama.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <flashcache/error.hpp>
#include <flashcache/llama.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace nb = nanobind;
namespace fl = flashcache::llama;

namespace {

// What the Python side sets up: the policy and its sizes; everything else is the library's default.
struct SessionParams {
  std::string when_full = "flashcache";
  std::int64_t n_cells = 0;
  std::int64_t n_keep = 4;
  double target = 0.75;
  bool archive = true;       // flashcache: evicted cells kept for recall (positions kept)
  std::int64_t recall = 64;  // cells a new turn may bring back (with the archive); 0: none
  std::int64_t max_pos = 0;  // 0: the model's training length - 1, then a restart
  int threads = 0;           // scoring threads; 0: the context's
};

// One conversation on one llama_context: the capture that takes the turn's queries
// (on the context's cb_eval, so it must live as long as the context) and the manager.
class Session {
 public:
  // The cb_eval callback and its user data, as addresses for llama-cpp-python's context params.
  std::uintptr_t eval_address() const { return reinterpret_cast<std::uintptr_t>(&fl::QueryCapture::eval); }
  std::uintptr_t capture_address() { return reinterpret_cast<std::uintptr_t>(&capture_); }

  void init(std::uintptr_t ctx_address, const SessionParams& sp) {
    auto* ctx = reinterpret_cast<llama_context*>(ctx_address);
    if (ctx == nullptr)
      throw flashcache::Error(
          flashcache::make_error(flashcache::Errc::invalid_option, "flashcache.llama_cpp: a null llama_context"));
    fl::ContextParams p = fl::context_default_params();
    flashcache::throw_if_error(fl::parse_when_full(sp.when_full, &p.when_full));
    p.n_cells = sp.n_cells;
    p.n_keep = sp.n_keep;
    p.target = sp.target;
    p.compress.n_threads = sp.threads;
    const bool archive = sp.archive && p.when_full == fl::WhenFull::flashcache;
    if (archive) {
      p.after_compaction = fl::AfterCompaction::archive;
      p.at_max_pos = fl::AtMaxPos::restart;  // a chat never hits the wall
      p.max_pos = static_cast<llama_pos>(sp.max_pos);
      if (sp.recall > 0) {
        p.recall.budget = sp.recall;
        p.recall.capture = &capture_;
      }
    }
    flashcache::throw_if_error(manager_.init(ctx, 0, p));
  }

  // Room for n new tokens: the first one's position and what was done (a dict).
  std::tuple<std::int64_t, nb::dict> make_room(std::int64_t n) {
    llama_pos pos = 0;
    fl::RoomEvent ev;
    flashcache::throw_if_error(manager_.make_room(n, &pos, &ev));
    nb::dict d;
    d["policy"] = fl::to_string(ev.policy);
    d["cells_before"] = ev.cells_before;
    d["cells_after"] = ev.cells_after;
    d["pos_max_before"] = ev.pos_max_before;
    d["pos_max_after"] = ev.pos_max_after;
    d["archived"] = ev.compaction.archived;
    d["restarted"] = ev.restarted;
    d["restart_dropped"] = ev.restart_dropped;
    d["ms"] = ev.ms;
    return {pos, d};
  }

  void begin_turn() { manager_.begin_turn(); }
  void protect_from(std::int64_t pos) { manager_.protect_from(static_cast<llama_pos>(pos)); }

  // The turn just decoded brings back what it needs from the archive; its stats (a dict).
  nb::dict recall_turn(const std::vector<llama_token>& turn) {
    fl::RecallStats st;
    flashcache::throw_if_error(manager_.recall_turn(turn.data(), static_cast<std::int64_t>(turn.size()), &st));
    nb::dict d;
    d["archive_tokens"] = st.archive_tokens;
    d["queries"] = st.queries;
    d["recalled"] = st.recalled;
    d["redecoded"] = st.redecoded;
    d["ms"] = st.ms;
    d["displaced"] = st.displaced;
    d["cells_after"] = st.cells_after;
    return d;
  }

  std::int64_t forget_from(std::int64_t pos) {
    std::int64_t dropped = 0;
    flashcache::throw_if_error(manager_.forget_from(static_cast<llama_pos>(pos), &dropped));
    return dropped;
  }

  std::int64_t cells() const { return manager_.cells(); }
  std::int64_t cap() const { return manager_.cap(); }
  std::int64_t archive_tokens() const { return manager_.archive().tokens(); }

 private:
  fl::QueryCapture capture_;
  fl::ContextManager manager_;
};

// The file this module's libllama symbols come from.
std::string library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&llama_decode), &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

}  // namespace

NB_MODULE(_llama, m) {
  m.doc() = "flashcache's llama.cpp adapter on llama-cpp-python's context; use flashcache.llama_cpp";
  nb::exception<flashcache::Error>(m, "Error", PyExc_ValueError);
  // A server's Llama (and its Session) may live until the interpreter exits: not a leak.
  nb::set_leak_warnings(false);
  m.def("library_path", &library_path, "The libllama file this module's llama.cpp symbols come from.");
  nb::list when_full;  // the policies' names, from their one table (flashcache/llama/context_params.hpp)
  for (const auto& n : flashcache::EnumNames<fl::WhenFull>::table) when_full.append(n.name);
  m.attr("when_full_choices") = nb::tuple(when_full);

  nb::class_<SessionParams>(m, "SessionParams")
      .def(nb::init<>())
      .def_rw("when_full", &SessionParams::when_full)
      .def_rw("n_cells", &SessionParams::n_cells)
      .def_rw("n_keep", &SessionParams::n_keep)
      .def_rw("target", &SessionParams::target)
      .def_rw("archive", &SessionParams::archive)
      .def_rw("recall", &SessionParams::recall)
      .def_rw("max_pos", &SessionParams::max_pos)
      .def_rw("threads", &SessionParams::threads);

  nb::class_<Session>(m, "Session")
      .def(nb::init<>())
      .def_prop_ro("eval_address", &Session::eval_address)
      .def_prop_ro("capture_address", &Session::capture_address)
      .def("init", &Session::init, nb::arg("ctx_address"), nb::arg("params"))
      .def("make_room", &Session::make_room, nb::arg("n"))
      .def("begin_turn", &Session::begin_turn)
      .def("protect_from", &Session::protect_from, nb::arg("pos"))
      .def("recall_turn", &Session::recall_turn, nb::arg("turn"))
      .def("forget_from", &Session::forget_from, nb::arg("pos"))
      .def_prop_ro("cells", &Session::cells)
      .def_prop_ro("cap", &Session::cap)
      .def_prop_ro("archive_tokens", &Session::archive_tokens);
}
