// How much of what a KV cache holds a conversation's next prompt reuses: the one rule that
// Session::KeepCommonPrefix (kvq chat, kvq serve's chat turns, the page's chat on WebAssembly)
// and the page's WebGPU path (kvq_web_positions_to_keep) follow.
#pragma once

#include <cstdint>
#include <span>

namespace kvq {

/// The positions of `held` (the ids a cache holds, in position order) that a next `prompt` keeps:
/// those up to where the two first differ, never all of `prompt` (its last id runs again, for
/// the logits that sample the first new token); 0 for an empty prompt.
int64_t PositionsToKeep(std::span<const int32_t> held, std::span<const int32_t> prompt);

}  // namespace kvq
