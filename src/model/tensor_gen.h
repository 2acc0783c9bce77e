// Random release-format tensors of one weight (make-tiny and --load-format dummy share it), in
// independent chunks of rows so that big tensors are generated on several threads. Every draw
// comes from a counter-based generator keyed by (seed, tensor name) and indexed by the element
// (or scale block): the bytes depend on the seed only, not on the chunking, the thread count or
// the order in which chunks run. Codes are written straight into the stored FP8 / FP4 / BF16
// bytes and E8M0 scales (no FP32 intermediates).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace flashseek::model {

struct WeightGen {
  WeightSpec spec;
  std::vector<StoredTensor> stored;  // release_tensors(spec, cfg): the weight, then its scale
  std::vector<uint64_t> bytes;       // bytes of each stored tensor
  int64_t rows = 1, cols = 1;        // logical 2-D view
  int64_t rows_per_chunk = 1;
  int64_t chunks = 1;
  // Values drawn 2^-std_shift times smaller (make-tiny --well-conditioned): the same codes, only
  // the block scales move.
  int std_shift = 0;
  uint64_t total_bytes() const {
    uint64_t t = 0;
    for (uint64_t b : bytes) t += b;
    return t;
  }
};

// Tensors up to this many elements are one chunk; bigger ones are split by rows (the unit of
// work handed to a thread; it does not change the bytes).
inline constexpr int64_t kDefaultChunkElems = int64_t(1) << 22;

// How `spec` is stored under cfg's formats and split into chunks of about `chunk_elems`.
WeightGen plan_weight(const WeightSpec& spec, const ModelConfig& cfg, int64_t chunk_elems = kDefaultChunkElems);

// Generates chunk `chunk` of `w`: writes that chunk's bytes of stored tensor i into dst[i] (the
// start of the whole stored tensor; only the chunk's own byte ranges are written), and, when
// `values` is not null, the intended dequantised values of the chunk's rows into `values` (the
// whole logical tensor, row-major).
void generate_chunk(const WeightGen& w, const ModelConfig& cfg, uint64_t seed, int64_t chunk,
                    uint8_t* const* dst, float* values);

// Where a weight's stored tensors go: image `image`, at these byte offsets (one per stored tensor).
struct WeightPlace {
  size_t image = 0;
  std::vector<uint64_t> offsets;
};

// Generates every chunk of every weight into the writable images (`images[place[i].image]` +
// offset), biggest chunks first, on `threads` threads. With `values`, (*values)[i] receives
// weight i's intended dequantised values (resized here).
void generate_weights(const std::vector<WeightGen>& gens, const std::vector<WeightPlace>& place,
                      const std::vector<uint8_t*>& images, const ModelConfig& cfg, uint64_t seed, int threads,
                      std::vector<std::vector<float>>* values);

// Runs fn(task) for task in [0, n) on `threads` threads (<= 0: all cores), handing tasks out in
// index order (put the big ones first).
void run_tasks(int64_t n, int threads, const std::function<void(int64_t)>& fn);

}  // namespace flashseek::model
