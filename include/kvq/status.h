// Status and Result<T>: how kvq reports failure at its boundaries (file parsing, flags, budgets).
// kvq does not throw across its API; a failed call returns a message that names what was wrong
// (the file, the flag, the value) and what was expected.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace kvq {

/// Success, or an error with a message for a human. Cheap to pass around.
class [[nodiscard]] Status {
 public:
  Status() = default;  ///< success
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message), true); }

  bool ok() const { return !failed_; }
  const std::string& message() const { return message_; }

 private:
  Status(std::string message, bool failed) : message_(std::move(message)), failed_(failed) {}
  std::string message_;
  bool failed_ = false;
};

/// A value or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}            // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}    // NOLINT: implicit by design

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  const T& value() const& { return *value_; }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  const T& operator*() const { return *value_; }
  const T* operator->() const { return &*value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace kvq
