// Checkpoints whose config declares a draft (V4 MTP, V4.1 DSpark) but ship none of its tensors
// (make-tiny --no-draft, like a backbone-only release): the CPU model loads without a draft, and
// the backbone's logits are bit-identical to those of the full checkpoint with the same seed.
// A V4 checkpoint's MTP block is a one-token draft: its proposal is the argmax of mtp_logits.
#include <algorithm>
#include <cstring>
#include <filesystem>

#include <unistd.h>

#include <gtest/gtest.h>

#include "forward/cpu_model.h"
#include "model/make_tiny.h"

namespace flashseek::forward {
namespace {

namespace fs = std::filesystem;

struct Dir {
  explicit Dir(const std::string& tag)
      : path((fs::temp_directory_path() / ("fs_draftless_" + tag + "_" + std::to_string(::getpid())))
                 .string()) {}
  ~Dir() { fs::remove_all(path); }
  std::string path;
};

class Draftless : public ::testing::TestWithParam<const char*> {};

TEST_P(Draftless, LoadsWithoutADraftAndTheSameBackbone) {
  auto cfg = model::builtin_config(GetParam());
  ASSERT_TRUE(cfg.ok());
  Dir full(std::string(GetParam()) + "_full"), bare(std::string(GetParam()) + "_bare");
  ASSERT_TRUE(model::make_tiny_checkpoint(*cfg, {.seed = 7, .bf16 = true}, full.path).ok());
  ASSERT_TRUE(model::make_tiny_checkpoint(*cfg, {.seed = 7, .bf16 = true, .draft = false}, bare.path).ok());
  auto with = CpuModel::load(full.path, Numerics::kExact);
  auto without = CpuModel::load(bare.path, Numerics::kExact);
  ASSERT_TRUE(with.ok()) << with.status().to_string();
  ASSERT_TRUE(without.ok()) << without.status().to_string();
  EXPECT_TRUE((*with)->has_draft());
  EXPECT_FALSE((*without)->has_draft());
  EXPECT_FALSE((*without)->has_mtp());
  EXPECT_EQ((*without)->draft_block_size(), 0);
  const std::vector<int32_t> toks = {3, 17, 5, 60, 2, 9, 41};
  std::vector<float> a, b;
  auto sa = (*with)->new_sequence(), sb = (*without)->new_sequence();
  BatchItem ia{sa.get(), toks, true}, ib{sb.get(), toks, true};
  ASSERT_TRUE((*with)->forward({&ia, 1}, a).ok());
  ASSERT_TRUE((*without)->forward({&ib, 1}, b).ok());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  EXPECT_FALSE((*without)->propose(*sb, 5).ok()) << "no draft to propose with";
  // V4: the MTP block is a one-token draft.
  if ((*with)->has_mtp()) {
    EXPECT_EQ((*with)->draft_block_size(), 1);
    auto block = (*with)->propose(*sa, 5);
    auto logits = (*with)->mtp_logits(*sa, 5);
    ASSERT_TRUE(block.ok() && logits.ok());
    ASSERT_EQ(block->tokens.size(), 1u);
    EXPECT_EQ(block->logits, *logits);
    EXPECT_EQ(block->tokens[0], int32_t(std::max_element(logits->begin(), logits->end()) - logits->begin()));
    auto chosen = (*with)->propose(*sa, 5, [](int64_t, std::span<const float>) { return int32_t(11); });
    ASSERT_TRUE(chosen.ok());
    EXPECT_EQ(chosen->tokens, std::vector<int32_t>{11});
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, Draftless, ::testing::Values("tiny-v4", "tiny-v41"),
                         [](const auto& info) { return std::string(info.param) == "tiny-v41" ? "v41" : "v4"; });

}  // namespace
}  // namespace flashseek::forward
