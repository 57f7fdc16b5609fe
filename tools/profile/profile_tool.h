// The command line of specd_profile (and of ssv_bench --tune, the SSV planner): flags, the
// measuring (profiler.h), the tables and the cost profile file. specd_profile measures the step
// times `auto` speculation chooses by (issue 20) on this device and writes them as the JSON cost
// profile engine/policy/cost_profile.h reads; with --ssv it also measures an NSA target's SSV
// strategies and prints their ranking (issue 35's planner). One thread.
#pragma once

namespace specd::profile {

// argv[1..argc) are the flags (argv[0] is skipped); `program` names the tool in messages.
// tune_ssv: --ssv defaults to the lossless strategies (ssv_bench --tune). Exit status: 0 written,
// 1 failed, 2 bad flags (the usage printed).
int RunProfileTool(const char* program, int argc, char** argv, bool tune_ssv);

}  // namespace specd::profile
