// OutputLock: one holder at a time; a dead holder's lock file is taken over.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "autoaccum/core/error.hpp"
#include "autoaccum/core/output_lock.hpp"

namespace autoaccum {
namespace {

class OutputLockTest : public testing::Test {
 protected:
  std::string dir;
  void SetUp() override {
    char name[] = "/tmp/autoaccum-lock-XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    dir = name;
  }
  void TearDown() override { (void)std::system(("rm -rf " + dir).c_str()); }
};

TEST_F(OutputLockTest, ASecondHolderIsRefusedWithTheFirstsPid) {
  const std::string path = dir + "/run.h5";
  std::optional<OutputLock> first;
  first.emplace("--run-log", path);
  EXPECT_TRUE(first->warning().empty());
  // flock belongs to the open file: another process is refused while this one holds it.
  const pid_t child = fork();
  if (child == 0) {
    try {
      OutputLock second("--run-log", path);
      _exit(10);
    } catch (const UsageError& e) {
      const std::string text = e.what();
      const bool named = text.find("--run-log") != std::string::npos &&
                         text.find("in use by another job") != std::string::npos &&
                         text.find("pid " + std::to_string(getppid())) != std::string::npos;
      _exit(named ? 0 : 11);
    }
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: not refused; 11: message without option or pid";
  first.reset();
  EXPECT_NE(access(OutputLock::lock_path(path).c_str(), F_OK), 0) << "released: file removed";
  OutputLock again("--run-log", path);
  EXPECT_TRUE(again.warning().empty());
}

TEST_F(OutputLockTest, ALockFileNobodyHoldsIsTakenOverWithAWarning) {
  const std::string path = dir + "/ck.h5";
  std::ofstream(OutputLock::lock_path(path)) << "host gone, pid 999999\n";
  OutputLock lock("--checkpoint", path);
  EXPECT_NE(lock.warning().find("took over"), std::string::npos);
  EXPECT_NE(lock.warning().find("pid 999999"), std::string::npos);
}

TEST_F(OutputLockTest, AnUnwritableFolderIsAOneLineUsageError) {
  EXPECT_THROW(OutputLock("--run-log", dir + "/missing/run.h5"), UsageError);
}

}  // namespace
}  // namespace autoaccum
