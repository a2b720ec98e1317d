// The one way kvq's subcommands print --json documents: indented, one document per line group,
// and text that is not valid UTF-8 (a random-weight model's byte tokens, a cut multi-byte
// character) written with U+FFFD in place of each bad byte instead of aborting the program.
#pragma once

#include <fmt/core.h>

#include <nlohmann/json.hpp>

namespace kvq::cli {

inline void PrintJson(const nlohmann::json& doc) {
  fmt::print("{}\n", doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace kvq::cli
