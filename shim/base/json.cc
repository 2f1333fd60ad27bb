// json: JSON string literals (see json.h).
#include "json.h"

#include <cstdint>

namespace lazypin {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

// Length of the well-formed UTF-8 sequence at the start of `s` (1..4), or 0
// with `*bad` set to the length of its maximal ill-formed subsequence (>= 1).
// The second byte's range depends on the lead byte (Unicode Table 3-7); every
// later byte is 80..BF.
size_t SequenceLength(const unsigned char* s, size_t size, size_t* bad) {
  const unsigned char lead = s[0];
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 3;
    if (lead == 0xE0) lo = 0xA0;       // no overlongs
    else if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 4;
    if (lead == 0xF0) lo = 0x90;       // no overlongs
    else if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    *bad = 1;  // 80..C1 (a continuation or an overlong lead), F5..FF
    return 0;
  }
  for (size_t i = 1; i < need; ++i) {
    const bool ok = i < size && s[i] >= (i == 1 ? lo : 0x80) && s[i] <= (i == 1 ? hi : 0xBF);
    if (!ok) {
      *bad = i;
      return 0;
    }
  }
  return need;
}

}  // namespace

std::string JsonString(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  std::string out;
  out.reserve(size + 2);
  out.push_back('"');
  size_t i = 0;
  while (i < size) {
    const unsigned char c = s[i];
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
      out.push_back(static_cast<char>(c));
      ++i;
    } else if (c < 0x80) {
      out.push_back('\\');
      switch (c) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '\n': out.push_back('n'); break;
        case '\t': out.push_back('t'); break;
        default:
          out.append("u00");
          out.push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 0xF]);
      }
      ++i;
    } else {
      size_t bad = 0;
      const size_t n = SequenceLength(s + i, size - i, &bad);
      if (n > 0) {
        out.append(text.data() + i, n);
        i += n;
      } else {
        out.append(kReplacement, 3);
        i += bad;
      }
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace lazypin
