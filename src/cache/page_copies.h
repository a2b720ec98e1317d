// A benchmark's shortcut into KvCache, kept out of the public interface (include/kvq/kv_cache.h):
// kvq bench context fills a million positions with it, and tests/cache/ checks its bits.
#pragma once

#include <cstdint>

#include "kvq/kv_cache.h"
#include "kvq/status.h"

namespace kvq {

/// Appends n_pages full pages to one layer of `cache` whose bytes are copies of its own full pages
/// [first_source, first_source + source_pages), taken in turn: page i copies first_source +
/// i % source_pages. The same bits as appending those pages' rows again (the layer's scales are
/// already set by the rows that made them), without encoding: how a benchmark fills a million
/// positions in seconds. The layer must end on a page boundary. Errors as KvCache::Append.
Status AppendPageCopies(KvCache& cache, int64_t layer, int64_t first_source, int64_t source_pages,
                        int64_t n_pages);

}  // namespace kvq
