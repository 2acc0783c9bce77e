// Runs the `openai` npm SDK tests (tests/server/js, `node --test`) against a live server on a
// free port backed by the fake backend. Needs node and `npm ci --prefix tests/server/js`.
#include <filesystem>

#include <gtest/gtest.h>

#include "server_fixture.h"
#include "test_util.h"

namespace flashseek::server::testing {
namespace {

TEST(OpenAiSdk, NodeTestsPassAgainstLiveServer) {
  const auto js = flashseek::testing::source_dir() / "tests/server/js";
  if (flashseek::testing::run_command("node --version").exit_code != 0)
    FS_SKIP_UNLESS_CI("node is not installed");
  if (!std::filesystem::exists(js / "node_modules/openai/package.json"))
    FS_SKIP_UNLESS_CI("openai SDK missing: run npm ci --prefix tests/server/js");
  LiveServer s;
  const auto r = flashseek::testing::run_command("cd '" + js.string() + "' && FLASHSEEK_URL=" +
                                                 s.url() + " timeout 120 node --test fake_backend.test.mjs");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("# fail 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("# pass 8"), std::string::npos) << r.output;  // every test ran
}

}  // namespace
}  // namespace flashseek::server::testing
