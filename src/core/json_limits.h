// Bounds on untrusted JSON text (HTTP bodies, checkpoint headers, config files), checked on the
// raw bytes BEFORE a tree is built: nlohmann's parser is iterative, but copying, dumping and
// destroying a tree recurse once per nesting level, so a 1M-deep array in a 2 MB body would
// overflow the stack long after parsing.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace flashseek {

struct JsonLimits {
  size_t max_depth = 64;         // nesting of [ and { (the top-level value is depth 1)
  size_t max_values = 1u << 18;  // values in the document (scalars, arrays, objects, keys)
};

enum class JsonScan { kOk, kTooDeep, kTooManyValues };

// One pass over `text` counting bracket depth and values outside string literals. The text need
// not be valid JSON (the parser that follows reports syntax errors); this only guarantees that
// a document it accepts cannot be deeper or larger than the limits.
JsonScan scan_json(std::string_view text, const JsonLimits& limits);

// A sentence for a 400 answer ("nested deeper than 64 levels").
std::string describe(JsonScan result, const JsonLimits& limits);

}  // namespace flashseek
