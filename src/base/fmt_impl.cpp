// fmt's out-of-line part, compiled into cordon instead of linked from libfmt.so (meson.build:
// Debian ships no static libfmt, and cordon links libstdc++ statically). format-inl.h holds
// fmt's non-template functions; the templates below are the ones cordon's code calls and
// fmt's headers only declare.
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {

template auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template auto decimal_point_impl<char>(locale_ref) -> char;

}  // namespace detail
FMT_END_NAMESPACE
