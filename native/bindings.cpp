// Python bindings of the native data path (hostlib._native). Only the binding glue lives here;
// each concern has its own file beside it.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

NB_MODULE(_native, m) {
    m.doc() = "inagg's per-packet data path in C++ (see native/*.hpp)";
    m.attr("ABI_VERSION") = 1;
}
