// fuzz_llama_state: the llama.cpp sequence-state parser and writer
// (include/flashcache/llama/state.hpp) on arbitrary bytes. parse_seq_state()
// must refuse a bad blob with a message, or describe sections that lie inside
// the bytes (every K and V element is converted to float here, so ASan sees a
// read past them); writing every cell in blob order must give back the input
// bytes, and writing every other cell (in position order) must parse back to
// exactly those cells with their positions and bytes (and a sliding-window
// model's second section, parsed with StateSections::global_then_sliding,
// byte for byte). Every input is tried both ways.
#include <flashcache/llama/state.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.hpp"

namespace fl = flashcache::llama;

namespace {

void convert_all(const std::uint8_t* blob, const fl::SeqState& s, const std::vector<std::int32_t>& cells) {
  std::vector<float> buf;
  for (std::size_t l = 0; l < s.layers.size(); ++l)
    for (fl::Part part : {fl::Part::k, fl::Part::v}) {
      const std::uint64_t embd = part == fl::Part::v ? s.layers[l].v_embd : s.layers[l].k_embd;
      buf.assign(static_cast<std::size_t>(embd) * cells.size(), 0.0f);
      fl::layer_to_float(blob, s, l, part, cells.data(), static_cast<std::uint32_t>(cells.size()), buf.data());
    }
}

void check(const std::uint8_t* data, std::size_t size, fl::StateSections sections) {
  fl::SeqState s;
  const flashcache::Status st = fl::parse_seq_state(data, size, &s, sections);
  if (!st.ok()) {
    FUZZ_CHECK(!st.message().empty(), "refused without a message");
    return;
  }
  FUZZ_CHECK(s.pos.size() == s.cell_count, "positions " + std::to_string(s.pos.size()));
  FUZZ_CHECK(fl::seq_state_size(s, s.cell_count) == size || s.cell_count == 0,
             "size " + std::to_string(fl::seq_state_size(s, s.cell_count)) + " != " + std::to_string(size));
  std::vector<std::int32_t> all(s.cell_count);
  for (std::uint32_t i = 0; i < s.cell_count; ++i) all[i] = static_cast<std::int32_t>(i);
  convert_all(data, s, all);

  std::vector<std::uint8_t> out;
  FUZZ_CHECK(fl::write_seq_state(data, s, all.data(), s.cell_count, &out).ok(), "writing every cell");
  if (s.cell_count > 0)
    FUZZ_CHECK(out.size() == size && std::memcmp(out.data(), data, size) == 0, "every cell does not round-trip");

  const std::vector<std::int32_t> order = fl::cells_by_position(s);
  std::vector<std::int32_t> kept;
  for (std::size_t i = 0; i < order.size(); i += 2) kept.push_back(order[i]);
  FUZZ_CHECK(fl::write_seq_state(data, s, kept.data(), static_cast<std::uint32_t>(kept.size()), &out).ok(),
             "writing every other cell");
  fl::SeqState t;
  const flashcache::Status back = fl::parse_seq_state(out.data(), out.size(), &t, sections);
  FUZZ_CHECK(back.ok(), "the written blob is refused: " + back.message());
  FUZZ_CHECK(t.cell_count == kept.size(), "kept " + std::to_string(t.cell_count));
  for (std::size_t i = 0; i < kept.size(); ++i) {
    FUZZ_CHECK(t.pos[i] == s.pos[static_cast<std::size_t>(kept[i])], "position of kept cell " + std::to_string(i));
    for (std::size_t l = 0; l < t.layers.size(); ++l) {
      const fl::LayerState &a = s.layers[l], &b = t.layers[l];
      FUZZ_CHECK(std::memcmp(out.data() + b.k_offset + i * b.k_row_bytes,
                             data + a.k_offset + static_cast<std::size_t>(kept[i]) * a.k_row_bytes, a.k_row_bytes) == 0,
                 "K bytes of kept cell " + std::to_string(i));
    }
  }
  FUZZ_CHECK(t.sliding.size == s.sliding.size &&
                 std::memcmp(out.data() + t.sliding.offset, data + s.sliding.offset, s.sliding.size) == 0,
             "the sliding-window section changed");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  check(data, size, fl::StateSections::one);
  check(data, size, fl::StateSections::global_then_sliding);
  return 0;
}
