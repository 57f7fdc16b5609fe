// specd_profile: the cost profile `auto` speculation and the SSV planner read, measured on this
// device (tools/profile/profile_tool.h).
#include "tools/profile/profile_tool.h"

int main(int argc, char** argv) {
  return specd::profile::RunProfileTool("specd_profile", argc, argv, /*tune_ssv=*/false);
}
