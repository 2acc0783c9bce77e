// Tokenizer throughput on one core over the committed parity corpus (~1.2 MB of mixed text).
// Reports bytes/s (MB/s) for encode with a warm word cache (the steady state of a server),
// encode with a cold cache (cache cleared every iteration), decode, and the streaming
// detokenizer. Needs models/tokenizer/tokenizer.json (scripts/fetch_tokenizer.sh).
//   build-dir/bench/bench_tokenizer [--benchmark_min_time=2]
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer_locate.h"

namespace {

using flashseek::tok::Tokenizer;

struct Fixture {
  std::unique_ptr<Tokenizer> tok;
  std::vector<std::string> docs;
  std::vector<std::vector<int32_t>> ids;
  size_t bytes = 0;
};

const Fixture* fixture() {
  static Fixture* f = [] {
    auto* fx = new Fixture;
    auto r = flashseek::tok::load_v41_tokenizer();
    if (!r.ok()) {
      std::fprintf(stderr, "bench_tokenizer: %s\n", r.status().to_string().c_str());
      return fx;
    }
    fx->tok = std::make_unique<Tokenizer>(std::move(r).value());
    std::ifstream in(std::string(FLASHSEEK_SOURCE_DIR) + "/tests/tokenizer/corpus/corpus.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      fx->docs.push_back(nlohmann::json::parse(line).get<std::string>());
      fx->bytes += fx->docs.back().size();
      fx->ids.push_back(fx->tok->encode(fx->docs.back()));
    }
    return fx;
  }();
  return f;
}

bool ready(benchmark::State& state, const Fixture* f) {
  if (f->tok && !f->docs.empty()) return true;
  state.SkipWithError("tokenizer or corpus missing (run scripts/fetch_tokenizer.sh)");
  return false;
}

void BM_EncodeWarmCache(benchmark::State& state) {
  const Fixture* f = fixture();
  if (!ready(state, f)) return;
  for (auto _ : state) {
    for (const auto& d : f->docs) benchmark::DoNotOptimize(f->tok->encode(d));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f->bytes));
}

void BM_EncodeColdCache(benchmark::State& state) {
  const Fixture* f = fixture();
  if (!ready(state, f)) return;
  for (auto _ : state) {
    f->tok->bpe().clear_cache();
    for (const auto& d : f->docs) benchmark::DoNotOptimize(f->tok->encode(d));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f->bytes));
}

void BM_Decode(benchmark::State& state) {
  const Fixture* f = fixture();
  if (!ready(state, f)) return;
  for (auto _ : state) {
    for (const auto& ids : f->ids) benchmark::DoNotOptimize(f->tok->decode(ids));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f->bytes));
}

void BM_StreamingDetokenize(benchmark::State& state) {
  const Fixture* f = fixture();
  if (!ready(state, f)) return;
  for (auto _ : state) {
    for (const auto& ids : f->ids) {
      flashseek::tok::IncrementalDetokenizer detok(*f->tok);
      for (int32_t id : ids) benchmark::DoNotOptimize(detok.feed(id));
      benchmark::DoNotOptimize(detok.flush());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f->bytes));
}

BENCHMARK(BM_EncodeWarmCache)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeColdCache)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StreamingDetokenize)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
