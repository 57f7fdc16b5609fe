#include "engine/base/local_communicator.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace specd {

class LocalCommGroup::RankComm : public Communicator {
 public:
  RankComm(LocalCommGroup* group, int32_t rank) : group_(group), rank_(rank) {}

  int32_t rank() const override { return rank_; }
  int32_t world_size() const override { return group_->world_size(); }
  bool on_device() const override { return false; }
  std::string name() const override { return "local"; }

  absl::Status AllReduceSum(void* data, size_t count, CommDataType type, void*) override {
    return group_->Collective(rank_, {Op::kAllReduceSum, nullptr, data, count, type, 0});
  }
  absl::Status AllGather(const void* send, void* recv, size_t count, CommDataType type,
                         void*) override {
    return group_->Collective(rank_, {Op::kAllGather, send, recv, count, type, 0});
  }
  absl::Status Broadcast(void* data, size_t count, CommDataType type, int32_t root,
                         void*) override {
    return group_->Collective(rank_, {Op::kBroadcast, nullptr, data, count, type, root});
  }
  absl::Status Barrier(void*) override { return group_->Collective(rank_, Call{}); }
  void Abort() override { group_->Abort(); }

 private:
  LocalCommGroup* group_;
  int32_t rank_;
};

namespace {

const char* OpName(int op) {
  static const char* kNames[] = {"AllReduceSum", "AllGather", "Broadcast", "Barrier"};
  return kNames[op];
}

}  // namespace

LocalCommGroup::LocalCommGroup(int32_t world_size) : world_size_(world_size) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.resize(world_size);
  for (int32_t r = 0; r < world_size; ++r) ranks_.push_back(std::make_unique<RankComm>(this, r));
}

LocalCommGroup::~LocalCommGroup() = default;

Communicator* LocalCommGroup::comm(int32_t rank) { return ranks_.at(rank).get(); }

void LocalCommGroup::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

absl::Status LocalCommGroup::Collective(int32_t rank, const Call& call) {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) return absl::UnavailableError("local communicator: the group was aborted");
  calls_[rank] = call;
  if (++arrived_ == world_size_) {  // the last to arrive does the work for everyone
    result_ = Perform();
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return result_;
  }
  // The next collective cannot complete before this rank enters it, so result_ is still ours
  // when we wake.
  const uint64_t generation = generation_;
  cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
  if (generation_ == generation) {
    return absl::UnavailableError("local communicator: the group was aborted");
  }
  return result_;
}

absl::Status LocalCommGroup::Perform() {
  const Call& first = calls_[0];
  for (int32_t r = 1; r < world_size_; ++r) {
    const Call& c = calls_[r];
    if (c.op != first.op || c.count != first.count || c.type != first.type ||
        c.root != first.root) {
      return absl::InternalError(
          absl::StrCat("local communicator: rank ", r, " called ", OpName(static_cast<int>(c.op)),
                       " of ", c.count, " elements while rank 0 called ",
                       OpName(static_cast<int>(first.op)), " of ", first.count));
    }
  }
  const size_t bytes = first.count * CommDataTypeBytes(first.type);
  if (bytes == 0) return absl::OkStatus();
  switch (first.op) {
    case Op::kAllReduceSum:
      if (first.type != CommDataType::kF32) {
        return absl::InvalidArgumentError("local communicator: AllReduceSum takes f32 only");
      }
      PerformAllReduceSum();
      return absl::OkStatus();
    case Op::kAllGather:
      for (const Call& dest : calls_) {
        for (int32_t r = 0; r < world_size_; ++r) {  // memmove: in place, send is recv's row r
          std::memmove(static_cast<char*>(dest.data) + r * bytes, calls_[r].send, bytes);
        }
      }
      return absl::OkStatus();
    case Op::kBroadcast:
      if (first.root < 0 || first.root >= world_size_) {
        return absl::InvalidArgumentError(
            absl::StrCat("local communicator: broadcast root ", first.root, " outside the group"));
      }
      for (int32_t r = 0; r < world_size_; ++r) {
        if (r != first.root) std::memcpy(calls_[r].data, calls_[first.root].data, bytes);
      }
      return absl::OkStatus();
    case Op::kBarrier:
      return absl::OkStatus();
  }
  return absl::InternalError("local communicator: unknown collective");
}

void LocalCommGroup::PerformAllReduceSum() {
  const size_t n = calls_[0].count;
  sum_.assign(static_cast<const float*>(calls_[0].data),
              static_cast<const float*>(calls_[0].data) + n);
  for (int32_t r = 1; r < world_size_; ++r) {  // rank order: the same bits on every rank
    const float* x = static_cast<const float*>(calls_[r].data);
    for (size_t i = 0; i < n; ++i) sum_[i] += x[i];
  }
  for (const Call& c : calls_) std::memcpy(c.data, sum_.data(), n * sizeof(float));
}

}  // namespace specd
