#pragma once
// One table of names per enum, which its to_string, its parser and its validity
// check all read: a new enumerator is named in one place. An enum takes part by
// specializing EnumNames with `table`, its values and names in order:
//
//   template <> struct EnumNames<Transform> {
//     static constexpr EnumName<Transform> table[] = {{Transform::global, "global"}, ...};
//   };
#include <cstddef>
#include <string>
#include <string_view>

#include "error.hpp"

namespace flashcache {

template <class E>
struct EnumName {
  E value;
  const char* name;
};

template <class E>
struct EnumNames;  // specialized next to each enum

// e's entry in its table; null for a value outside it (a cast integer).
template <class E>
constexpr const EnumName<E>* find_enum(E e) {
  for (const EnumName<E>& n : EnumNames<E>::table)
    if (n.value == e) return &n;
  return nullptr;
}

// The enumerator's name; "unknown" for a value outside the table.
template <class E>
constexpr const char* enum_name(E e) {
  const EnumName<E>* n = find_enum(e);
  return n != nullptr ? n->name : "unknown";
}

// Whether e is one of the table's values (what option checks refuse otherwise).
template <class E>
constexpr bool is_known(E e) {
  return find_enum(e) != nullptr;
}

// Every name, "a, b or c": what an error lists as the choices.
template <class E>
std::string enum_choices() {
  std::string out;
  const std::size_t count = sizeof(EnumNames<E>::table) / sizeof(EnumNames<E>::table[0]);
  for (std::size_t i = 0; i < count; ++i) {
    if (i > 0) out += i + 1 == count ? " or " : ", ";
    out += EnumNames<E>::table[i].name;
  }
  return out;
}

// The value named `name`; an unknown name is refused with the choices, after `what`.
template <class E>
Status parse_enum(std::string_view name, E* out, const char* what) {
  for (const EnumName<E>& n : EnumNames<E>::table)
    if (name == n.name) {
      *out = n.value;
      return Status::success();
    }
  return make_error(Errc::invalid_option, "unknown ", what, " '", std::string(name), "' (", enum_choices<E>(), ")");
}

}  // namespace flashcache
