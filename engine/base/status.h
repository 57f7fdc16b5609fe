// Status helpers used across specd. Everything fallible returns absl::Status or
// absl::StatusOr<T>; these macros keep call sites short. Any thread.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SPECD_CONCAT_INNER_(a, b) a##b
#define SPECD_CONCAT_(a, b) SPECD_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define SPECD_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status specd_status_ = (expr);         \
    if (!specd_status_.ok()) return specd_status_; \
  } while (0)

// `SPECD_ASSIGN_OR_RETURN(auto x, Foo());` unwraps a StatusOr or returns its error.
#define SPECD_ASSIGN_OR_RETURN(lhs, expr) \
  SPECD_ASSIGN_OR_RETURN_IMPL_(SPECD_CONCAT_(specd_statusor_, __LINE__), lhs, expr)
#define SPECD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
