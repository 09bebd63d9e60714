#pragma once
// Byte-level BPE (GPT-2 style) and the ChatML chat template, both read from a
// GGUF file; the same token ids as BPETokenizer in tools/smollm2/tokenizer.py:
//   1. control tokens (token_type 3, e.g. <|im_start|>) are matched literally, longest first;
//   2. every \p{N} code point is a piece of its own;
//   3. the rest is split by 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+;
//   4. each piece's bytes map to printable characters and merge by rank.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gguf.hpp"
#include "unicode_ranges.hpp"

namespace engine {

namespace unicode {

template <std::size_t N>
bool in_ranges(const CodeRange (&table)[N], std::uint32_t c) {
  const CodeRange* it =
      std::upper_bound(table, table + N, c, [](std::uint32_t x, const CodeRange& r) { return x < r.lo; });
  return it != table && c <= (it - 1)->hi;
}
inline bool is_letter(std::uint32_t c) { return in_ranges(kLetter, c); }
inline bool is_number(std::uint32_t c) { return in_ranges(kNumber, c); }
inline bool is_space(std::uint32_t c) { return in_ranges(kSpace, c); }

inline void append_utf8(std::uint32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// Strict UTF-8 decoding (no overlongs, surrogates or values past U+10FFFF); the
// code points and, one longer, the byte offset where each starts.
inline void decode_utf8(const std::string& s, std::vector<std::uint32_t>* cps, std::vector<std::size_t>* offsets) {
  cps->clear();
  offsets->clear();
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    std::uint32_t c = len == 1 ? b0 : len == 2 ? (b0 & 0x1Fu) : len == 3 ? (b0 & 0x0Fu) : (b0 & 0x07u);
    bool ok = len > 0 && i + static_cast<std::size_t>(len) <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
      ok = (b & 0xC0) == 0x80;
      c = (c << 6) | (b & 0x3Fu);
    }
    static const std::uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (!ok || c < kMin[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
      throw std::invalid_argument("text is not valid UTF-8 at byte " + std::to_string(i));
    cps->push_back(c);
    offsets->push_back(i);
    i += static_cast<std::size_t>(len);
  }
  offsets->push_back(s.size());
}

}  // namespace unicode

class Tokenizer {
 public:
  // Reads tokenizer.ggml.{tokens, token_type, merges, eos_token_id} and tokenizer.chat_template.
  explicit Tokenizer(const GgufFile& f) {
    const std::string model = f.get_string("tokenizer.ggml.model");
    if (model != "gpt2") throw std::invalid_argument("tokenizer model '" + model + "' is not byte-level BPE (gpt2)");
    tokens_ = f.get_strings("tokenizer.ggml.tokens");
    const auto& types = f.get_ints("tokenizer.ggml.token_type");
    const auto& merges = f.get_strings("tokenizer.ggml.merges");
    if (types.size() != tokens_.size())
      throw std::invalid_argument("tokenizer: " + std::to_string(types.size()) + " token types for " +
                                  std::to_string(tokens_.size()) + " tokens");
    for (std::size_t i = 0; i < tokens_.size(); ++i) {
      to_id_.insert_or_assign(tokens_[i], static_cast<int>(i));  // later duplicates win, as in a Python dict
      if (types[i] != 3) continue;
      // An empty control token would match at every position and never advance.
      if (tokens_[i].empty()) throw std::invalid_argument("tokenizer: control token " + std::to_string(i) + " is empty");
      special_.insert_or_assign(tokens_[i], static_cast<int>(i));
    }
    for (std::size_t r = 0; r < merges.size(); ++r) {
      if (merges[r].find(' ') == std::string::npos)
        throw std::invalid_argument("tokenizer: merge " + std::to_string(r) + " has no space");
      ranks_.insert_or_assign(merges[r], static_cast<int>(r));
    }
    for (const auto& kv : special_) special_by_length_.push_back(kv.first);
    std::stable_sort(special_by_length_.begin(), special_by_length_.end(),
                     [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
    eos_id_ = static_cast<int>(f.get_int("tokenizer.ggml.eos_token_id"));
    // byte -> printable code point: printable Latin-1 maps to itself, the other 68 bytes to 256, 257, ...
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const auto cp = static_cast<std::uint32_t>(printable ? b : 256 + extra++);
      byte_char_[b].clear();
      unicode::append_utf8(cp, &byte_char_[b]);
      char_byte_[cp] = static_cast<std::uint8_t>(b);
    }
    if (const MetaValue* t = f.find("tokenizer.chat_template"); t != nullptr && t->type == GgufType::string)
      read_chat_template(t->s);
  }

  int vocab_size() const { return static_cast<int>(tokens_.size()); }
  int eos_id() const { return eos_id_; }
  // Ids after which generation stops: <|im_end|> (eos) and <|endoftext|>.
  bool is_stop(int id) const {
    auto it = special_.find("<|endoftext|>");
    return id == eos_id_ || (it != special_.end() && id == it->second);
  }
  const std::string& default_system() const { return default_system_; }

  std::vector<int> encode(const std::string& text) const {
    std::vector<int> ids;
    std::size_t start = 0, i = 0;
    while (i <= text.size()) {
      const std::string* hit = nullptr;
      for (const auto& s : special_by_length_)
        if (text.compare(i, s.size(), s) == 0 && i + s.size() <= text.size()) {
          hit = &s;
          break;
        }
      if (hit == nullptr && i < text.size()) {
        ++i;
        continue;
      }
      encode_ordinary(text.substr(start, i - start), &ids);
      if (hit == nullptr) break;
      ids.push_back(special_.at(*hit));
      i += hit->size();
      start = i;
    }
    return ids;
  }

  std::string decode(const std::vector<int>& ids) const {
    std::string out;
    std::vector<std::uint32_t> cps;
    std::vector<std::size_t> offsets;
    for (int id : ids) {
      if (id < 0 || id >= vocab_size()) throw std::out_of_range("token id " + std::to_string(id) + " out of range");
      const std::string& tok = tokens_[static_cast<std::size_t>(id)];
      if (special_.count(tok) != 0) {
        out += tok;
        continue;
      }
      unicode::decode_utf8(tok, &cps, &offsets);
      for (auto c : cps) {
        auto it = char_byte_.find(c);
        if (it != char_byte_.end()) out.push_back(static_cast<char>(it->second));
      }
    }
    return out;
  }

  // The ChatML prompt for one user turn, ready for the assistant's answer.
  std::string chat(const std::string& user) const {
    std::string s;
    if (!default_system_.empty()) s += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
    return s + "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
  }

 private:
  void read_chat_template(const std::string& t) {
    if (t.find("<|im_start|>") == std::string::npos) return;  // not ChatML: chat() still writes ChatML turns
    const std::string open = "<|im_start|>system\n";
    const auto a = t.find(open);
    const auto b = a == std::string::npos ? a : t.find("<|im_end|>", a + open.size());
    if (b != std::string::npos) default_system_ = t.substr(a + open.size(), b - a - open.size());
  }

  // Steps 2 to 4 on text without control tokens.
  void encode_ordinary(const std::string& text, std::vector<int>* ids) const {
    if (text.empty()) return;
    std::vector<std::uint32_t> cps;
    std::vector<std::size_t> off;
    unicode::decode_utf8(text, &cps, &off);
    std::size_t part = 0;
    for (std::size_t i = 0; i <= cps.size(); ++i) {
      if (i < cps.size() && !unicode::is_number(cps[i])) continue;
      split_words(text, cps, off, part, i, ids);  // the text before the digit
      if (i < cps.size()) split_words(text, cps, off, i, i + 1, ids);
      part = i + 1;
    }
  }

  // The GPT-2 pattern over code points [begin, end), which is a whole part: its end is the text's end.
  void split_words(const std::string& text, const std::vector<std::uint32_t>& c, const std::vector<std::size_t>& off,
                   std::size_t begin, std::size_t end, std::vector<int>* ids) const {
    using unicode::is_letter;
    using unicode::is_number;
    using unicode::is_space;
    auto other = [&](std::uint32_t x) { return !is_space(x) && !is_letter(x) && !is_number(x); };
    std::size_t i = begin;
    while (i < end) {
      std::size_t j = i;
      auto run = [&](std::size_t from, auto pred) {
        while (from < end && pred(c[from])) ++from;
        return from;
      };
      if (c[i] == '\'' && i + 1 < end && (c[i + 1] == 's' || c[i + 1] == 't' || c[i + 1] == 'm' || c[i + 1] == 'd')) {
        j = i + 2;
      } else if (c[i] == '\'' && i + 2 < end &&
                 ((c[i + 1] == 'r' && c[i + 2] == 'e') || (c[i + 1] == 'v' && c[i + 2] == 'e') ||
                  (c[i + 1] == 'l' && c[i + 2] == 'l'))) {
        j = i + 3;
      } else {
        const std::size_t s = (c[i] == ' ' && i + 1 < end) ? i + 1 : i;  // the optional leading space
        if (is_letter(c[s])) {
          j = run(s, is_letter);
        } else if (is_number(c[s])) {
          j = run(s, is_number);
        } else if (other(c[s])) {
          j = run(s, other);
        } else {  // whitespace: \s+(?!\S) gives back the last space before a non-space, else \s+
          j = run(i, is_space);
          if (j < end && j - i > 1) --j;
          if (j == i) j = i + 1;  // unreachable: every code point is L, N, space or other
        }
      }
      bpe(text.substr(off[i], off[j] - off[i]), ids);
      i = j;
    }
  }

  // Merges the byte-mapped characters of one piece by rank (lowest first, leftmost on ties).
  void bpe(const std::string& piece, std::vector<int>* ids) const {
    auto cached = cache_.find(piece);
    if (cached != cache_.end()) {
      ids->insert(ids->end(), cached->second.begin(), cached->second.end());
      return;
    }
    std::vector<std::string> sym;
    for (unsigned char b : piece) sym.push_back(byte_char_[b]);
    std::string key;
    while (sym.size() > 1) {
      int best = std::numeric_limits<int>::max();
      std::size_t pos = 0;
      for (std::size_t k = 0; k + 1 < sym.size(); ++k) {
        key.assign(sym[k]).append(" ").append(sym[k + 1]);
        auto it = ranks_.find(key);
        if (it != ranks_.end() && it->second < best) {
          best = it->second;
          pos = k;
        }
      }
      if (best == std::numeric_limits<int>::max()) break;
      const std::string first = sym[pos], second = sym[pos + 1];
      std::vector<std::string> merged;
      for (std::size_t k = 0; k < sym.size();) {
        if (k + 1 < sym.size() && sym[k] == first && sym[k + 1] == second) {
          merged.push_back(first + second);
          k += 2;
        } else {
          merged.push_back(sym[k++]);
        }
      }
      sym.swap(merged);
    }
    std::vector<int> out;
    for (const auto& s : sym) {
      auto it = to_id_.find(s);
      if (it == to_id_.end()) throw std::invalid_argument("tokenizer: no vocabulary entry for '" + s + "'");
      out.push_back(it->second);
    }
    ids->insert(ids->end(), out.begin(), out.end());
    if (cache_.size() < 65536) cache_.emplace(piece, std::move(out));
  }

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int> to_id_, special_, ranks_;
  std::vector<std::string> special_by_length_;
  std::string byte_char_[256];
  std::unordered_map<std::uint32_t, std::uint8_t> char_byte_;
  std::string default_system_;
  int eos_id_ = 0;
  mutable std::unordered_map<std::string, std::vector<int>> cache_;
};

}  // namespace engine
