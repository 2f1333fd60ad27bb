// json: JSON text for the log (docs/log-format.md). Standard library only.
#pragma once

#include <string>
#include <string_view>

namespace lazypin {

// `s` as a JSON string literal, quotes included, always valid UTF-8: '"' and
// '\' are escaped, control characters (below U+0020) become \n, \t or \u00XX,
// well-formed UTF-8 passes through unchanged, and each maximal ill-formed
// subsequence (a stray continuation byte, an overlong form, a surrogate
// U+D800..U+DFFF, a code point above U+10FFFF, a sequence cut short) becomes
// one U+FFFD -- the Unicode Standard's recommended practice, the same text as
// Python's bytes.decode("utf-8", "replace"). Allocates; not for signal handlers.
std::string JsonString(std::string_view s);

}  // namespace lazypin
