#include "codec/patch_metadata.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace deltasync::patchmeta {

std::string PythonFloatRepr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";

  // Shortest round-trip digits, as "[-]d[.ddd]e[+-]xx".
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(end - buf));
  std::string out;
  if (sci.front() == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits(1, sci[0]);
  if (e > 1) digits.append(sci.substr(2, e - 2));
  const int exp10 = std::atoi(std::string(sci.substr(e + 1)).c_str());
  // value = 0.<digits> x 10^decpt; CPython's repr switches to scientific
  // notation when decpt <= -4 or decpt > 16.
  const int decpt = exp10 + 1;
  const int ndigits = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (decpt >= ndigits) {
      out += digits;
      out.append(static_cast<size_t>(decpt - ndigits), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt));
      out += '.';
      out += digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits[0];
  if (ndigits > 1) {
    out += '.';
    out += digits.substr(1);
  }
  const int x = decpt - 1;
  out += x < 0 ? "e-" : "e+";
  const int ax = std::abs(x);
  if (ax < 10) out += '0';
  out += std::to_string(ax);
  return out;
}

double Sparsity(uint64_t changed, uint64_t total) {
  return 1.0 - static_cast<double>(changed) / static_cast<double>(std::max<uint64_t>(total, 1));
}

}  // namespace deltasync::patchmeta
