// Process-wide switches that break a verifier on purpose: the statistical tests' negative
// controls (a broken verifier whose output the chi-square test must reject). Test code only
// (tools/check_deps.py lets the test files of any module include this header, and nothing
// else): no production header declares them. Each is defined beside the code that reads it and
// is never changed in the server. Not synchronised: set them before starting work.
#pragma once

#include "engine/sample/acceptance.h"

namespace specd {
namespace acceptance_internal {

// The rule every Acceptor uses (engine/sample/acceptance.cc). Engine-level losslessness tests
// set kDraftOverTargetForTest to show they can fail.
extern Rule acceptor_rule_for_test;

}  // namespace acceptance_internal

namespace runner_internal {

// CUDA builds only (engine/runner/cuda/cuda_runner_verify.cc): when true, the CUDA runner's
// sampled verification (StepKind::kSampledVerify) accepts every draft the target gives any mass
// to (its accept tests draw u = 0), so the output follows the draft's distribution.
extern bool verify_accepts_every_draft_for_test;

}  // namespace runner_internal
}  // namespace specd
