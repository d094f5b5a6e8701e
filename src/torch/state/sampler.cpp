#include "holdpoint/state/sampler.h"

#include <ATen/ops/randperm.h>

#include <algorithm>
#include <exception>
#include <vector>

#include "holdpoint/schema/resume_profile.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "state/state_fields.h"
#include "state/tensor_state.h"

namespace holdpoint {

namespace {

const std::string kComponentName = "sampler";
const std::string kSequential = "sequential";
const std::string kRandom = "random";
const std::string kStateful = "stateful";
const std::string kDistributed = "distributed";

void check_epoch_argument(std::int64_t epoch) {
  if (epoch < 0) state::state_error(ErrorCode::invalid_argument, "sampler: epoch ", epoch, " is negative");
}

// The fields every sampler state has.
void check_header(const state::FieldReader& reader, const std::string& kind, std::int64_t num_samples) {
  const std::string& found_kind = reader.string("kind");
  if (found_kind != kind) {
    state::state_error(ErrorCode::state_structure_mismatch, reader.path_of("kind"), " is '", found_kind,
                       "', the live sampler is '", kind, "'");
  }
  const std::int64_t found_samples = reader.integer("num_samples");
  if (found_samples != num_samples) {
    state::state_error(ErrorCode::state_structure_mismatch, reader.path_of("num_samples"), " is ", found_samples,
                       ", the live sampler has ", num_samples);
  }
  const std::int64_t epoch = reader.integer("epoch");
  if (epoch < 0) state::state_error(ErrorCode::state_value_invalid, reader.path_of("epoch"), " = ", epoch, " is negative");
}

std::int64_t read_cursor(const state::FieldReader& reader, std::int64_t length) {
  const std::int64_t cursor = reader.integer("cursor");
  if (cursor < 0 || cursor > length) {
    state::state_error(ErrorCode::state_value_invalid, reader.path_of("cursor"), " = ", cursor, " is outside 0..",
                       length);
  }
  return cursor;
}

Dict header(const std::string& kind, std::int64_t num_samples, std::int64_t epoch) {
  Dict entries;
  entries.insert("kind", Value::string(kind));
  entries.insert("num_samples", Value::integer(num_samples));
  entries.insert("epoch", Value::integer(epoch));
  return entries;
}

// `order` must be an int64 tensor of shape [n] holding each of 0..n-1 once.
void check_permutation(const TensorData& order, std::int64_t n, const std::string& path) {
  if (order.dtype != DType::int64) {
    state::state_error(ErrorCode::state_dtype_mismatch, path, " has dtype ", dtype_name(order.dtype), ", not int64");
  }
  if (order.sizes.size() != 1 || order.sizes[0] != n) {
    state::state_error(ErrorCode::state_shape_mismatch, path, " is not a 1-d tensor of the ", n, " sample indices");
  }
  // n is the live sampler's, so the bitmap is sized by the program, not the file.
  const at::Tensor values = to_at_tensor(order).contiguous();
  const std::int64_t* ids = values.data_ptr<std::int64_t>();
  std::vector<bool> seen(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t id = ids[i];
    if (id < 0 || id >= n) {
      state::state_error(ErrorCode::state_value_invalid, path, "[", i, "] = ", id, " is outside 0..", n - 1);
    }
    if (seen[static_cast<std::size_t>(id)]) {
      state::state_error(ErrorCode::state_value_invalid, path, "[", i, "] = ", id, " repeats an earlier index");
    }
    seen[static_cast<std::size_t>(id)] = true;
  }
}

}  // namespace

// ---- SequentialSampler ------------------------------------------------------------

SequentialSampler::SequentialSampler(std::int64_t num_samples) : num_samples_(num_samples) {
  if (num_samples < 0) state::state_error(ErrorCode::invalid_argument, "sampler: num_samples ", num_samples, " is negative");
}

const std::string& SequentialSampler::kind() const { return kSequential; }

std::optional<std::int64_t> SequentialSampler::next() {
  if (cursor_ == num_samples_) return std::nullopt;
  return cursor_++;
}

void SequentialSampler::start_epoch(std::int64_t epoch) {
  check_epoch_argument(epoch);
  epoch_ = epoch;
  cursor_ = 0;
}

Value SequentialSampler::capture_state(CaptureMode) const {
  Dict entries = header(kSequential, num_samples_, epoch_);
  entries.insert("cursor", Value::integer(cursor_));
  return Value::dict(std::move(entries));
}

void SequentialSampler::validate_state(const Value& state) const {
  const state::FieldReader reader(state, kComponentName);
  reader.allow_only({"kind", "num_samples", "epoch", "cursor"});
  check_header(reader, kSequential, num_samples_);
  read_cursor(reader, num_samples_);
}

void SequentialSampler::apply_state(const Value& state) {
  const state::FieldReader reader(state, kComponentName);
  epoch_ = reader.integer("epoch");
  cursor_ = reader.integer("cursor");
}

// ---- RandomSampler ------------------------------------------------------------------

RandomSampler::RandomSampler(std::int64_t num_samples, at::Generator generator)
    : num_samples_(num_samples), generator_(std::move(generator)) {
  if (num_samples < 0) state::state_error(ErrorCode::invalid_argument, "sampler: num_samples ", num_samples, " is negative");
  if (!generator_.defined() || generator_.device().type() != c10::DeviceType::CPU) {
    state::state_error(ErrorCode::invalid_argument, "sampler: RandomSampler needs a CPU generator");
  }
  start_epoch(0);
}

const std::string& RandomSampler::kind() const { return kRandom; }

std::optional<std::int64_t> RandomSampler::next() {
  if (cursor_ == num_samples_) return std::nullopt;
  return order_.data_ptr<std::int64_t>()[cursor_++];
}

void RandomSampler::start_epoch(std::int64_t epoch) {
  check_epoch_argument(epoch);
  // randperm locks the generator itself.
  order_ = at::randperm(num_samples_, generator_, at::kLong);
  epoch_ = epoch;
  cursor_ = 0;
}

Value RandomSampler::capture_state(CaptureMode mode) const {
  Dict entries = header(kRandom, num_samples_, epoch_);
  // start_epoch replaces order_ rather than writing into it, so a reference
  // capture stays valid for the rest of the epoch and beyond.
  entries.insert("order", state::capture_tensor(order_, mode));
  entries.insert("cursor", Value::integer(cursor_));
  return Value::dict(std::move(entries));
}

void RandomSampler::validate_state(const Value& state) const {
  const state::FieldReader reader(state, kComponentName);
  reader.allow_only({"kind", "num_samples", "epoch", "order", "cursor"});
  check_header(reader, kRandom, num_samples_);
  check_permutation(reader.tensor("order"), num_samples_, reader.path_of("order"));
  read_cursor(reader, num_samples_);
}

void RandomSampler::apply_state(const Value& state) {
  const state::FieldReader reader(state, kComponentName);
  // A clone keeps a strided view's strides; next() indexes the elements directly.
  order_ = state::tensor_from_state(reader.tensor("order")).contiguous();
  epoch_ = reader.integer("epoch");
  cursor_ = reader.integer("cursor");
}

// ---- StatefulSampler ------------------------------------------------------------------

StatefulSampler::StatefulSampler(StatefulSamplerProtocol& sampler) : sampler_(sampler) {}

const std::string& StatefulSampler::kind() const { return kStateful; }

void StatefulSampler::start_epoch(std::int64_t epoch) {
  check_epoch_argument(epoch);
  sampler_.start_epoch(epoch);
  epoch_ = epoch;
}

Value StatefulSampler::capture_state(CaptureMode mode) const {
  Dict entries = header(kStateful, sampler_.num_samples(), epoch_);
  entries.insert("sampler_kind", Value::string(sampler_.kind()));
  const Value inner = sampler_.state_dict();
  entries.insert("state_dict", mode == CaptureMode::copy ? deep_copy(inner) : inner);
  return Value::dict(std::move(entries));
}

void StatefulSampler::validate_state(const Value& state) const {
  const state::FieldReader reader(state, kComponentName);
  reader.allow_only({"kind", "num_samples", "epoch", "sampler_kind", "state_dict"});
  check_header(reader, kStateful, sampler_.num_samples());
  const std::string& sampler_kind = reader.string("sampler_kind");
  if (sampler_kind != sampler_.kind()) {
    state::state_error(ErrorCode::state_structure_mismatch, reader.path_of("sampler_kind"), " is '", sampler_kind,
                       "', the live sampler is '", sampler_.kind(), "'");
  }
  const Value& inner = reader.required("state_dict");
  try {
    sampler_.validate_state_dict(inner);
  } catch (const std::exception& error) {
    state::state_error(ErrorCode::state_value_invalid, reader.path_of("state_dict"), ": ", error.what());
  }
}

void StatefulSampler::apply_state(const Value& state) {
  const state::FieldReader reader(state, kComponentName);
  sampler_.load_state_dict(reader.required("state_dict"));
  epoch_ = reader.integer("epoch");
}

// ---- component ------------------------------------------------------------------------

const std::string& SamplerState::name() const { return kComponentName; }

// ---- DistributedSampler ---------------------------------------------------------------

namespace {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Indices a rank yields from `start` in a world of `world` over n samples.
std::int64_t rank_share(std::int64_t n, std::int64_t start, std::int64_t world, std::int64_t rank) {
  const std::int64_t first = start + rank;
  return first >= n ? 0 : (n - first + world - 1) / world;
}

}  // namespace

DistributedSampler::DistributedSampler(std::int64_t num_samples, std::uint64_t seed, std::int64_t world_size,
                                       std::int64_t rank)
    : num_samples_(num_samples), seed_(seed), world_size_(world_size), rank_(rank) {
  if (num_samples < 0) state::state_error(ErrorCode::invalid_argument, "sampler: num_samples ", num_samples, " is negative");
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    state::state_error(ErrorCode::invalid_argument, "sampler: rank ", rank, " is not in a world of ", world_size);
  }
  start_epoch(0);
}

const std::string& DistributedSampler::kind() const { return kDistributed; }

std::vector<std::int64_t> DistributedSampler::permutation(std::int64_t num_samples, std::uint64_t seed,
                                                          std::int64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(num_samples));
  for (std::int64_t i = 0; i < num_samples; ++i) order[static_cast<std::size_t>(i)] = i;
  std::uint64_t state = seed ^ (0xd1b54a32d192ed03ull * static_cast<std::uint64_t>(epoch + 1));
  for (std::int64_t i = num_samples - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(splitmix64(state) % static_cast<std::uint64_t>(i + 1));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

std::optional<std::int64_t> DistributedSampler::next() {
  const std::int64_t position = start_ + rank_ + cursor_ * world_size_;
  if (position >= num_samples_) return std::nullopt;
  ++cursor_;
  return order_[static_cast<std::size_t>(position)];
}

void DistributedSampler::start_epoch(std::int64_t epoch) {
  check_epoch_argument(epoch);
  if (epoch != epoch_ || order_.empty()) order_ = permutation(num_samples_, seed_, epoch);
  epoch_ = epoch;
  start_ = 0;
  cursor_ = 0;
}

std::int64_t DistributedSampler::remaining() const {
  return rank_share(num_samples_, start_, world_size_, rank_) - cursor_;
}

std::int64_t DistributedSampler::remaining_on_every_rank() const {
  return std::max<std::int64_t>(0, rank_share(num_samples_, start_, world_size_, world_size_ - 1) - cursor_);
}

Value DistributedSampler::capture_state(CaptureMode) const {
  Dict entries = header(kDistributed, num_samples_, epoch_);
  entries.insert("seed", Value::integer(static_cast<std::int64_t>(seed_)));
  entries.insert("world_size", Value::integer(world_size_));
  entries.insert("rank", Value::integer(rank_));
  entries.insert("start", Value::integer(start_));
  entries.insert("cursor", Value::integer(cursor_));
  return Value::dict(std::move(entries));
}

void DistributedSampler::validate_state(const Value& state) const {
  const state::FieldReader reader(state, kComponentName);
  reader.allow_only({"kind", "num_samples", "epoch", "seed", "world_size", "rank", "start", "cursor"});
  check_header(reader, kDistributed, num_samples_);
  if (reader.integer("seed") != static_cast<std::int64_t>(seed_)) {
    state::state_error(ErrorCode::state_structure_mismatch, reader.path_of("seed"), " is ", reader.integer("seed"),
                       ", the live sampler's is ", static_cast<std::int64_t>(seed_));
  }
  if (reader.integer("world_size") != world_size_ || reader.integer("rank") != rank_) {
    state::state_error(ErrorCode::state_value_invalid, kComponentName, " was saved by rank ", reader.integer("rank"),
                       " of ", reader.integer("world_size"), "; this is rank ", rank_, " of ", world_size_,
                       " (a changed world size needs reassign_distributed_sampler_state)");
  }
  const std::int64_t start = reader.integer("start");
  if (start < 0 || start > num_samples_) {
    state::state_error(ErrorCode::state_value_invalid, reader.path_of("start"), " = ", start, " is outside 0..",
                       num_samples_);
  }
  read_cursor(reader, rank_share(num_samples_, start, world_size_, rank_));
}

void DistributedSampler::apply_state(const Value& state) {
  const state::FieldReader reader(state, kComponentName);
  const std::int64_t epoch = reader.integer("epoch");
  if (epoch != epoch_ || order_.empty()) order_ = permutation(num_samples_, seed_, epoch);
  epoch_ = epoch;
  start_ = reader.integer("start");
  cursor_ = reader.integer("cursor");
}

Value reassign_distributed_sampler_state(std::span<const Value* const> saved, std::int64_t new_rank,
                                         std::int64_t new_world) {
  if (saved.empty()) state::state_error(ErrorCode::invalid_argument, "sampler: no saved states to reassign");
  if (new_world < 1 || new_rank < 0 || new_rank >= new_world) {
    state::state_error(ErrorCode::invalid_argument, "sampler: rank ", new_rank, " is not in a world of ", new_world);
  }
  const state::FieldReader first(*saved[0], "sampler@rank0");
  if (first.string("kind") != kDistributed) {
    state::state_error(ErrorCode::distributed_world_size_changed, "the saved sampler is '", first.string("kind"),
                       "'; only a DistributedSampler's position can be reassigned to another world size");
  }
  const auto old_world = static_cast<std::int64_t>(saved.size());
  for (std::int64_t r = 0; r < old_world; ++r) {
    const state::FieldReader reader(*saved[static_cast<std::size_t>(r)], "sampler@rank" + std::to_string(r));
    for (const char* field : {"num_samples", "seed", "epoch", "start", "world_size"}) {
      if (reader.string("kind") != kDistributed || reader.integer(field) != first.integer(field)) {
        state::state_error(ErrorCode::distributed_cursor_uneven, reader.path_of(field),
                           " differs from rank 0's; the saved ranks were not in one epoch position");
      }
    }
    if (reader.integer("world_size") != old_world || reader.integer("rank") != r) {
      state::state_error(ErrorCode::state_value_invalid, reader.path(), " names rank ", reader.integer("rank"), " of ",
                         reader.integer("world_size"), " in a checkpoint of ", old_world, " ranks");
    }
    if (reader.integer("cursor") != first.integer("cursor")) {
      state::state_error(ErrorCode::distributed_cursor_uneven, reader.path_of("cursor"), " = ",
                         reader.integer("cursor"), ", rank 0's is ", first.integer("cursor"),
                         ": the global position is ambiguous, so it is not reassigned");
    }
  }
  const std::int64_t n = first.integer("num_samples");
  const std::int64_t consumed = first.integer("start") + first.integer("cursor") * old_world;
  Dict entries = header(kDistributed, n, first.integer("epoch"));
  entries.insert("seed", Value::integer(first.integer("seed")));
  entries.insert("world_size", Value::integer(new_world));
  entries.insert("rank", Value::integer(new_rank));
  entries.insert("start", Value::integer(std::min(consumed, n)));
  entries.insert("cursor", Value::integer(0));
  return Value::dict(std::move(entries));
}

void SamplerState::describe(ProfileFacts& facts) const {
  if (const auto* random = dynamic_cast<const RandomSampler*>(&sampler_)) {
    facts.sampler_kind = "random";
    facts.sampler_generator = random->generator().unsafeGetGeneratorImpl();
  } else if (dynamic_cast<const StatefulSampler*>(&sampler_)) {
    facts.sampler_kind = "custom";
  } else {
    facts.sampler_kind = sampler_.kind();
  }
}

}  // namespace holdpoint
