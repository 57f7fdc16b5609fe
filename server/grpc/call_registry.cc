#include "server/grpc/call_registry.h"

#include "server/random_id.h"

namespace specd {

absl::StatusOr<std::string> NewRequestId() { return NewRandomId("grpc-"); }

}  // namespace specd
