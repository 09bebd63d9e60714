// The cells a llama.cpp compaction evicts, kept in an Archive (flashcache/llama/state/evict.hpp,
// CompressParams::archive, AfterCompaction::archive) on SmolLM2-135M: every evicted cell is in
// the archive with its position and its K and V rows bit for bit as the state held them
// (V rows, transposed V, q8_0), or counted as dropped by the cap; a refused call leaves the
// sequence and the archive as they were. Skips without llama.cpp or the model.
#include "llama_test_model.hpp"

#if !FLASHCACHE_HAVE_LLAMA

TEST(LlamaArchive, NeedsLlamaCpp) { GTEST_SKIP() << FLASHCACHE_LLAMA_INSTALL_HINT; }

#else

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace {

using llama_test::Ctx;
using llama_test::g_model;
using llama_test::ledger_tokens;
using llama_test::state_of;

void make_ctx(Ctx* c, ggml_type type, llama_flash_attn_type fa, uint32_t n_ctx = 1024) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = n_ctx;
  cp.n_batch = cp.n_ubatch = 256;
  cp.n_threads = cp.n_threads_batch = 1;
  cp.type_k = cp.type_v = type;
  cp.flash_attn_type = fa;
  c->ctx = llama_init_from_model(g_model, cp);
  ASSERT_NE(c->ctx, nullptr);
}

// Each archived cell against the state it was evicted from: its position held a
// cell there, and its K and V rows are that cell's bytes (V gathered when transposed).
void expect_archived_as_stored(const fc::Archive& a, std::int64_t first, const std::vector<std::uint8_t>& blob) {
  fl::SeqState s;
  ASSERT_TRUE(fl::parse_seq_state(blob.data(), blob.size(), &s).ok());
  const std::int64_t k_row = a.shape().k_row_bytes(), v_row = a.shape().v_row_bytes();
  std::vector<std::uint8_t> v(static_cast<std::size_t>(v_row));
  for (std::int64_t t = first; t < a.tokens(); ++t) {
    const auto at = std::find(s.pos.begin(), s.pos.end(), a.positions()[t]);
    ASSERT_NE(at, s.pos.end()) << "archived position " << a.positions()[t] << " was not in the state";
    const auto cell = static_cast<std::size_t>(at - s.pos.begin());
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      const fl::LayerState& L = s.layers[l];
      ASSERT_EQ(std::memcmp(a.k_row(static_cast<int>(l), t), blob.data() + L.k_offset + cell * L.k_row_bytes,
                            static_cast<std::size_t>(k_row)),
                0)
          << "K, layer " << l << ", position " << a.positions()[t];
      if (s.v_trans) {
        const std::size_t row = static_cast<std::size_t>(s.cell_count) * L.v_elem_bytes;
        for (std::uint64_t j = 0; j < L.v_embd; ++j)
          std::memcpy(v.data() + j * L.v_elem_bytes, blob.data() + L.v_offset + j * row + cell * L.v_elem_bytes,
                      L.v_elem_bytes);
      } else {
        std::memcpy(v.data(), blob.data() + L.v_offset + cell * L.v_row_bytes, v.size());
      }
      ASSERT_EQ(std::memcmp(a.v_row(static_cast<int>(l), t), v.data(), v.size()), 0)
          << "V, layer " << l << ", position " << a.positions()[t];
    }
  }
}

// An f16 context (flash attention) with the first n tokens of the running text decoded.
void prefill(Ctx* c, int n) {
  make_ctx(c, GGML_TYPE_F16, LLAMA_FLASH_ATTN_TYPE_ENABLED);
  const std::vector<llama_token> text = ledger_tokens(20);
  ASSERT_EQ(ls::decode(c->ctx, text.data(), n, 0, 0, false), 0);
}

fl::CompressParams keep_into(fc::Budget budget, fc::Archive* archive) {
  fl::CompressParams p = fl::compress_default_params();
  p.budget = budget;
  p.archive = archive;
  return p;
}

// A running context of `cells` cells whose evictions go to the archive (positions kept).
fl::ContextParams archiving(std::int64_t cells) {
  fl::ContextParams p = fl::context_default_params();
  p.n_cells = cells;
  p.after_compaction = fl::AfterCompaction::archive;
  return p;
}

class LlamaArchive : public llama_test::ModelTest {};

}  // namespace

// Two compactions of one sequence, for V rows, transposed V and q8_0: the archive holds
// exactly the cells each evicted, bit for bit, and with the resident cells every
// position decoded.
TEST_F(LlamaArchive, EvictedCellsAreArchivedBitForBit) {
  struct Kind {
    ggml_type type;
    llama_flash_attn_type fa;
    const char* name;
  };
  for (const Kind& kind : {Kind{GGML_TYPE_F16, LLAMA_FLASH_ATTN_TYPE_ENABLED, "f16, V rows"},
                           Kind{GGML_TYPE_F16, LLAMA_FLASH_ATTN_TYPE_DISABLED, "f16, V transposed"},
                           Kind{GGML_TYPE_Q8_0, LLAMA_FLASH_ATTN_TYPE_ENABLED, "q8_0"}}) {
    SCOPED_TRACE(kind.name);
    Ctx c;
    make_ctx(&c, kind.type, kind.fa);
    const std::vector<llama_token> text = ledger_tokens(20);
    ASSERT_EQ(ls::decode(c.ctx, text.data(), 300, 0, 0, false), 0);
    fc::Archive archive;
    fl::SequenceCompressor comp;
    fl::CompactionStats st;
    const std::vector<std::uint8_t> before = state_of(c);
    fc::Status s = comp.compress(c.ctx, 0, keep_into(fc::Budget::ratio(0.3), &archive), &st);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(st.archived, 300 - 90);
    ASSERT_EQ(archive.tokens(), 300 - 90);
    EXPECT_EQ(archive.shape().k_type, kind.type == GGML_TYPE_Q8_0 ? fc::RowType::q8_0 : fc::RowType::f16);
    expect_archived_as_stored(archive, 0, before);

    // More text, then a second compaction: its evictions follow the first's.
    ASSERT_EQ(ls::decode(c.ctx, text.data() + 300, 40, 300, 0, false), 0);
    const std::vector<std::uint8_t> second = state_of(c);
    s = comp.compress(c.ctx, 0, keep_into(fc::Budget::tokens(64), &archive), &st);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(st.archived, 90 + 40 - 64);
    ASSERT_EQ(archive.tokens(), 300 - 90 + 66);
    expect_archived_as_stored(archive, 300 - 90, second);

    std::set<llama_pos> seen(archive.positions(), archive.positions() + archive.tokens());
    EXPECT_EQ(static_cast<std::int64_t>(seen.size()), archive.tokens()) << "a position archived twice";
    for (llama_pos p : comp.kept_positions()) EXPECT_TRUE(seen.insert(p).second) << "kept and archived: " << p;
    EXPECT_EQ(seen.size(), 340u);
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), 339);
  }
}

// The byte cap drops whole blocks of the oldest evictions, and says how many.
TEST_F(LlamaArchive, TheCapsDropsAreCounted) {
  Ctx c;
  prefill(&c, 300);
  fc::Archive archive;
  fl::CompressParams p = keep_into(fc::Budget::tokens(100), &archive);
  p.archive_options.block_size = 16;
  fl::CompactionStats st;
  fl::SequenceCompressor comp;
  {
    // The cap is in bytes: 100 tokens' worth of this model's rows (30 layers, 3 x 64, f16).
    const std::int64_t token_bytes = 4 + 30 * 2 * (3 * 64 * 2);
    p.archive_options.byte_cap = 100 * token_bytes;
  }
  const fc::Status s = comp.compress(c.ctx, 0, p, &st);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(st.archived, 200);
  EXPECT_EQ(st.archive_dropped, 112);  // 200 - 100 rounded up to whole blocks of 16
  EXPECT_EQ(archive.dropped_tokens(), 112);
  EXPECT_EQ(archive.tokens(), 88);
  EXPECT_LE(archive.bytes(), p.archive_options.byte_cap);
}

// An archive of another shape is refused before anything is touched: the
// sequence and the archive stay as they were.
TEST_F(LlamaArchive, AnArchiveOfAnotherShapeIsRefusedAndNothingChanges) {
  Ctx c;
  prefill(&c, 200);
  fc::Archive other;
  ASSERT_TRUE(other.reset({2, 1, 32, fc::RowType::f32, fc::RowType::f32}).ok());
  const std::int32_t pos[1] = {7};
  std::vector<float> row(32, 1.0f);
  const void* rows[2] = {row.data(), row.data()};
  ASSERT_TRUE(other.append(pos, 1, rows, 128, rows, 128).ok());
  const std::vector<std::uint8_t> before = state_of(c);
  fl::SequenceCompressor comp;
  const fc::Status s = comp.compress(c.ctx, 0, keep_into(fc::Budget::ratio(0.3), &other), nullptr);
  EXPECT_EQ(s.code(), fc::Errc::invalid_shape) << s.message();
  EXPECT_NE(s.message().find("it holds 2 layers x 1 x 32 (K f32, V f32) but this sequence's cells are 30 x 3 x 64"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(state_of(c), before);
  EXPECT_EQ(other.tokens(), 1);
  EXPECT_EQ(other.positions()[0], 7);
}

// A context that fills: with the archive on, every position streamed is resident or
// archived, and an archive beside a policy that renumbers (shift) is refused.
TEST_F(LlamaArchive, AContextManagerArchivesEveryEviction) {
  Ctx c;
  make_ctx(&c, GGML_TYPE_F16, LLAMA_FLASH_ATTN_TYPE_ENABLED, 512);
  fl::ContextParams p = archiving(256);
  p.when_full = fl::WhenFull::shift;
  fl::ContextManager cm;
  const fc::Status refused = cm.init(c.ctx, 0, p);
  EXPECT_NE(refused.message().find("an archive with when-full shift"), std::string::npos) << refused.message();
  p.when_full = fl::WhenFull::flashcache;
  const fc::Status ok = cm.init(c.ctx, 0, p);
  ASSERT_TRUE(ok.ok()) << ok.message();
  const std::vector<llama_token> text = ledger_tokens(40);
  ASSERT_GT(text.size(), 700u);
  std::int64_t archived = 0;
  for (std::size_t i = 0; i < 700; i += 50) {
    llama_pos pos = -1;
    fl::RoomEvent ev;
    const fc::Status s = cm.make_room(50, &pos, &ev);
    ASSERT_TRUE(s.ok()) << s.message();
    archived += ev.compaction.archived;
    ASSERT_EQ(ls::decode(c.ctx, text.data() + i, 50, pos, 0, false), 0);
  }
  EXPECT_GT(cm.events(), 1);
  EXPECT_EQ(cm.archive().tokens(), archived);
  EXPECT_EQ(cm.archive().tokens() + cm.cells(), 700);
  EXPECT_EQ(llama_memory_seq_pos_max(c.mem(), 0), 699);  // positions kept, not renumbered
}

// Positions are kept with an archive, so they grow: past max_pos (by default the model's
// training length) make_room refuses by name and changes nothing.
TEST_F(LlamaArchive, PositionsPastTheLimitAreRefusedByName) {
  Ctx c;
  make_ctx(&c, GGML_TYPE_F16, LLAMA_FLASH_ATTN_TYPE_ENABLED, 512);
  fl::ContextParams p = archiving(256);
  p.max_pos = 399;
  fl::ContextManager cm;
  ASSERT_TRUE(cm.init(c.ctx, 0, p).ok());
  const std::vector<llama_token> text = ledger_tokens(40);
  for (std::size_t i = 0; i < 400; i += 50) {
    llama_pos pos = -1;
    ASSERT_TRUE(cm.make_room(50, &pos).ok());
    ASSERT_EQ(ls::decode(c.ctx, text.data() + i, 50, pos, 0, false), 0);
  }
  const std::int64_t cells = cm.cells(), archived = cm.archive().tokens();
  llama_pos pos = -1;
  const fc::Status s = cm.make_room(1, &pos);
  EXPECT_EQ(s.code(), fc::Errc::unsupported) << s.message();
  EXPECT_NE(s.message().find("1 new tokens after position 399 pass position 399, the highest a token may take"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(cm.cells(), cells);
  EXPECT_EQ(cm.archive().tokens(), archived);
  EXPECT_EQ(llama_memory_seq_pos_max(c.mem(), 0), 399);
}

// AtMaxPos::restart: past max_pos the manager compacts with renumbering instead of
// refusing, and drops the archive (its positions would be wrong), counted: every
// position streamed is resident, archived or counted as dropped.
TEST_F(LlamaArchive, ARestartAtTheLimitRenumbersAndCountsWhatItDrops) {
  Ctx c;
  make_ctx(&c, GGML_TYPE_F16, LLAMA_FLASH_ATTN_TYPE_ENABLED, 512);
  fl::ContextParams p = archiving(256);
  p.max_pos = 399;
  p.at_max_pos = fl::AtMaxPos::restart;
  fl::ContextManager cm;
  ASSERT_TRUE(cm.init(c.ctx, 0, p).ok());
  const std::vector<llama_token> text = ledger_tokens(40);
  std::int64_t restarts = 0, restart_dropped = 0;
  for (std::size_t i = 0; i < 700; i += 50) {
    llama_pos pos = -1;
    fl::RoomEvent ev;
    const fc::Status s = cm.make_room(50, &pos, &ev);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_LE(pos + 49, 399);
    restarts += ev.restarted;
    restart_dropped += ev.restart_dropped;
    if (ev.restarted) {
      EXPECT_EQ(cm.archive().tokens(), 0);
      EXPECT_EQ(ev.pos_max_after + 1, ev.cells_after);  // renumbered from 0
    }
    ASSERT_EQ(ls::decode(c.ctx, text.data() + i, 50, pos, 0, false), 0);
  }
  EXPECT_GE(restarts, 1);
  EXPECT_GT(cm.archive().dropped_tokens(), 0);  // the archive's part, counted there too
  EXPECT_LE(cm.archive().dropped_tokens(), restart_dropped);
  EXPECT_EQ(cm.cells() + cm.archive().tokens() + restart_dropped, 700);
}

// forget_from: an edited conversation drops the sequence from a position on. The cells
// there leave the memory and the archive's blocks there leave the archive, counted; the
// positions below stay resident or archived (but for a straddling block's), and the stream goes on.
TEST_F(LlamaArchive, ForgetFromDropsTheCellsAndArchiveFromAPosition) {
  Ctx c;
  make_ctx(&c, GGML_TYPE_F16, LLAMA_FLASH_ATTN_TYPE_ENABLED, 512);
  fl::ContextManager cm;
  ASSERT_TRUE(cm.init(c.ctx, 0, archiving(256)).ok());
  const std::vector<llama_token> text = ledger_tokens(40);
  auto stream = [&](std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; i += 50) {
      llama_pos pos = -1;
      const fc::Status s = cm.make_room(50, &pos);
      ASSERT_TRUE(s.ok()) << s.message();
      ASSERT_EQ(ls::decode(c.ctx, text.data() + i, 50, pos, 0, false), 0);
    }
  };
  stream(0, 700);
  ASSERT_GT(cm.events(), 1);
  auto resident_below = [&](llama_pos p) {
    fl::SeqState st;
    const std::vector<std::uint8_t> blob = state_of(c);
    EXPECT_TRUE(fl::parse_seq_state(blob.data(), blob.size(), &st).ok());
    return std::count_if(st.pos.begin(), st.pos.end(), [p](llama_pos q) { return q < p; });
  };

  // After the last compaction: only the newest cells go, the archive stays.
  const std::int64_t archived = cm.archive().tokens(), cells = cm.cells();
  std::int64_t dropped = -1;
  ASSERT_TRUE(cm.forget_from(680, &dropped).ok());
  EXPECT_EQ(dropped, 0);
  EXPECT_EQ(cm.archive().tokens(), archived);
  EXPECT_EQ(cm.cells(), cells - 20);
  EXPECT_EQ(llama_memory_seq_pos_max(c.mem(), 0), 679);

  // Inside the compacted part: the archive loses its blocks from there on, counted.
  const fc::Status forgot = cm.forget_from(300, &dropped);
  ASSERT_TRUE(forgot.ok()) << forgot.message();
  EXPECT_GT(dropped, 0);
  EXPECT_EQ(cm.cells(), resident_below(300));
  EXPECT_EQ(cm.archive().tokens() + dropped, archived);  // whole blocks leave, counted
  // The archive's blocks follow positions, so one block at most straddles 300: the positions
  // below it are resident or archived, but for fewer than a block of them.
  EXPECT_LE(cm.cells() + cm.archive().tokens(), 300);
  EXPECT_GT(cm.cells() + cm.archive().tokens(), 300 - cm.archive().options().block_size);
  for (std::int64_t t = 0; t < cm.archive().tokens(); ++t) EXPECT_LT(cm.archive().positions()[t], 300);
  EXPECT_LT(llama_memory_seq_pos_max(c.mem(), 0), 300);

  // The stream goes on from there (new tokens after the last kept position), compacting again.
  const std::int64_t before = cm.events();
  stream(300, 700);
  EXPECT_GT(cm.events(), before);
  EXPECT_LE(cm.cells(), 256);
  const fc::Status refused = cm.forget_from(-1);
  EXPECT_NE(refused.message().find("forget_from(-1)"), std::string::npos) << refused.message();
}

#endif
