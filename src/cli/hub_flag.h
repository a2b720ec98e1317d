// -hf / --hf-repo on the commands that load a model, and the one path from it to a file: the
// hub's GGUF in the Hugging Face cache, downloaded first when missing (src/hub/). kvq pull uses
// the same download messages.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "cli/flags.h"
#include "hub/hub_client.h"

namespace kvq::cli {

/// --hf-repo user/name[:quant] into o->hf_repo (checked as the hub's names are). main() reads
/// llama.cpp's spelling -hf as --hf-repo: CLI11 takes one-letter short names only.
CLI::Option* AddHfRepoFlag(CLI::App* cmd, SharedOptions* o);

/// With -hf given, sets o->model to the cached file it names (downloading it, with a message, when
/// the cache lacks it). Returns 0, or the exit code after printing "kvq <command>: error: ..."
/// (2: -m with -hf, or a bad name; 1: the hub or the download failed). Call before anything
/// reads o->ModelPath().
int ResolveModelFlag(const std::string& command, SharedOptions* o);

/// The download messages of `kvq <command>` on stderr: none when quiet; else a line naming the
/// file, then a progress bar redrawn in place on a terminal, or a line every 5 s otherwise.
hub::PullEvents DownloadMessages(const std::string& command, bool quiet);

}  // namespace kvq::cli
