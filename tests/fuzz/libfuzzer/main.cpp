// libFuzzer entry of one harness (FS_FUZZ_TARGET, set per binary by CMake). An empty corpus
// directory given on the command line first receives the harness's seeds, so a campaign starts
// from valid inputs: fuzz_snapshot CORPUS_DIR -max_total_time=600 (scripts/fuzz.sh).
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fuzz/targets.h"

namespace {

const flashseek::fuzz::Target* target = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  target = flashseek::fuzz::find_target(FS_FUZZ_TARGET);
  if (!target) {
    std::fprintf(stderr, "no fuzz harness named %s\n", FS_FUZZ_TARGET);
    std::abort();
  }
  namespace fs = std::filesystem;
  for (int i = 1; i < *argc; ++i) {
    const char* arg = (*argv)[i];
    std::error_code ec;
    if (arg[0] == '-' || !fs::is_directory(arg, ec) || !fs::is_empty(arg, ec)) continue;
    int n = 0;
    for (const auto& seed : target->seeds()) {
      std::ofstream out(fs::path(arg) / ("seed-" + std::to_string(n++)), std::ios::binary);
      out.write(reinterpret_cast<const char*>(seed.data()), std::streamsize(seed.size()));
    }
    std::fprintf(stderr, "%s: wrote %d seeds into %s\n", FS_FUZZ_TARGET, n, arg);
    break;
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  target->run({data, size});
  return 0;
}
