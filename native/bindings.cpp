// Python bindings of the native data path (hostlib._native). Only the binding glue lives here;
// each concern has its own file beside it and its own bind_* function.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace inagg {
void bind_stream(nb::module_& m);
}

NB_MODULE(_native, m) {
    m.doc() = "inagg's per-packet data path in C++ (see native/*.hpp)";
    m.attr("ABI_VERSION") = 1;
    inagg::bind_stream(m);
}
