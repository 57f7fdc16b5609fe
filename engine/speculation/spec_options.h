// The engine's speculative decoding options: the server's default method and K and the models
// to load (`--speculative-config`, spec_config.h), and `auto`'s cost profile (`--cost-profile`).
// A leaf of EngineOptions / ServeOptions. Plain values; any thread.
#pragma once

#include <string>

#include "engine/speculation/spec_config.h"

namespace specd {

struct SpeculativeOptions {
  // The default method and K for requests that do not choose, and the draft model to load (it
  // runs on the engine's device, with its own KV).
  SpeculativeConfig speculative;
  // `auto` speculation's cost profile: the JSON specd_profile writes (engine/policy/
  // cost_profile.h). "": the default profile of the runner in use (DefaultCostProfile in
  // engine/step/auto_strategy.cc). A file that does not load fails Engine::Create.
  std::string cost_profile;
};

}  // namespace specd
