#include "engine/stop_checker.h"

#include "gtest/gtest.h"

namespace specd {
namespace {

TEST(StopCheckerTest, CutsTextBeforeStopStringSpanningDeltas) {
  StopChecker c({"\n\n", "END"});
  EXPECT_FALSE(c.Append("def f():\n"));
  EXPECT_EQ(c.TakeStreamable(false), "def f():");  // "\n" may start "\n\n"
  EXPECT_TRUE(c.Append("\nreturn"));
  EXPECT_EQ(c.text(), "def f():");
  EXPECT_EQ(c.TakeStreamable(false), "");
}

TEST(StopCheckerTest, HoldsBackPartialMatchAndReleasesWhenItFails) {
  StopChecker c({"STOP"});
  c.Append("abcST");
  EXPECT_EQ(c.TakeStreamable(false), "abc");
  c.Append("x");
  EXPECT_EQ(c.TakeStreamable(false), "STx");
  c.Append("ST");
  EXPECT_EQ(c.TakeStreamable(true), "ST");  // final: nothing held back
}

TEST(StopCheckerTest, EarliestStopWinsAndNoStopsStreamEverything) {
  StopChecker c({"cd", "b"});
  EXPECT_TRUE(c.Append("abcd"));
  EXPECT_EQ(c.text(), "a");
  StopChecker none({});
  none.Append("xyz");
  EXPECT_EQ(none.TakeStreamable(false), "xyz");
}

}  // namespace
}  // namespace specd
