// RngRegistry: every kind of generator round-trips through a real checkpoint
// file and then draws exactly what the original would have; the inventory
// fails closed; corrupted states are rejected; and every rejection leaves
// every generator bit-identical.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/normal.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randperm.h>

#include <cstring>
#include <stdexcept>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/state/rng_registry.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

// A user generator: a 64-bit LCG whose state is its 8 bytes.
struct Lcg {
  std::uint64_t state = 1;
  std::uint64_t next() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  }
};

UserGenerator callbacks_for(Lcg& lcg) {
  return UserGenerator{
      [&lcg] { return std::string(reinterpret_cast<const char*>(&lcg.state), sizeof lcg.state); },
      [](std::string_view state) {
        if (state.size() != sizeof(std::uint64_t)) throw std::invalid_argument("an LCG state is 8 bytes");
      },
      [&lcg](std::string_view state) { std::memcpy(&lcg.state, state.data(), sizeof lcg.state); }};
}

// The next draws of every generator: compared bitwise, they show whether two
// sets of generators are in the same state.
struct Draws {
  at::Tensor default_uniform, default_normal, default_permutation, explicit_uniform, explicit_permutation;
  std::vector<std::uint64_t> mt, mt64, pcg, user;

  bool operator==(const Draws& other) const {
    return default_uniform.equal(other.default_uniform) && default_normal.equal(other.default_normal) &&
           default_permutation.equal(other.default_permutation) && explicit_uniform.equal(other.explicit_uniform) &&
           explicit_permutation.equal(other.explicit_permutation) && mt == other.mt && mt64 == other.mt64 &&
           pcg == other.pcg && user == other.user;
  }
};

template <typename Engine>
std::vector<std::uint64_t> next_values(Engine& engine) {
  std::vector<std::uint64_t> values;
  for (int i = 0; i < 8; ++i) values.push_back(engine());
  return values;
}

Draws draw(const at::Generator& default_generator, const at::Generator& explicit_generator, std::mt19937& mt,
           std::mt19937_64& mt64, pcg64& pcg, Lcg& lcg) {
  Draws draws;
  draws.default_uniform = at::rand({5}, default_generator, at::kDouble);
  draws.default_normal = at::randn({3}, default_generator);
  draws.default_permutation = at::randperm(10, default_generator);
  draws.explicit_uniform = at::rand({5}, explicit_generator);
  draws.explicit_permutation = at::randperm(10, explicit_generator);
  draws.mt = next_values(mt);
  draws.mt64 = next_values(mt64);
  draws.pcg = next_values(pcg);
  for (int i = 0; i < 8; ++i) draws.user.push_back(lcg.next());
  return draws;
}

// Every kind of generator, registered; the default CPU generator is the
// process-wide one, as in a training program.
struct Generators {
  at::Generator explicit_generator;
  std::mt19937 mt;
  std::mt19937_64 mt64;
  pcg64 pcg;
  Lcg lcg;
  RngRegistry registry;

  explicit Generators(std::uint64_t seed)
      : explicit_generator(at::detail::createCPUGenerator(seed)), mt(seed + 1), mt64(seed + 2), pcg(seed + 3, seed + 4) {
    lcg.state = seed + 5;
    register_default_generators(registry);
    registry.add("sampler", explicit_generator);
    registry.add("augment.mt", mt);
    registry.add("augment.mt64", mt64);
    registry.add("dropout.pcg", pcg);
    registry.add("env.user", callbacks_for(lcg));
  }

  // Advances every generator, so that states are mid-stream (and the CPU
  // generator has a cached normal sample).
  void advance() {
    const at::Generator default_generator = at::detail::getDefaultCPUGenerator();
    draw(default_generator, explicit_generator, mt, mt64, pcg, lcg);
    at::normal(0.0, 1.0, {1}, default_generator);
  }

  Draws draw_live() { return draw(at::detail::getDefaultCPUGenerator(), explicit_generator, mt, mt64, pcg, lcg); }
};

// Copies of every generator's state, taken before an operation, to show
// afterwards that the live generators did not move.
struct Snapshot {
  explicit Snapshot(const Generators& live)
      : default_clone(at::detail::getDefaultCPUGenerator().clone()),
        explicit_clone(live.explicit_generator.clone()),
        mt(live.mt),
        mt64(live.mt64),
        pcg(live.pcg),
        lcg(live.lcg),
        captured(live.registry.capture(CaptureMode::copy)) {}

  Draws draw_copies() { return draw(default_clone, explicit_clone, mt, mt64, pcg, lcg); }

  at::Generator default_clone, explicit_clone;
  std::mt19937 mt;
  std::mt19937_64 mt64;
  pcg64 pcg;
  Lcg lcg;
  Value captured;
};

// The registry's state with `key` replaced by `entry` (or removed when
// `entry` is nullopt), leaving `state` itself unchanged.
Value with_entry(const Value& state, const std::string& key, std::optional<Value> entry) {
  Dict entries;
  bool replaced = false;
  for (const auto& [name, value] : state.as_dict()) {
    if (name.as_string() != key) {
      entries.insert(name, value);
    } else if (entry) {
      entries.insert(name, *entry);
      replaced = true;
    } else {
      replaced = true;
    }
  }
  if (!replaced && entry) entries.insert(key, *entry);
  return Value::dict(std::move(entries));
}

Value entry_of(const std::string& kind, Value state) {
  Dict entry;
  entry.insert("kind", Value::string(kind));
  entry.insert("state", std::move(state));
  return Value::dict(std::move(entry));
}

Value with_state(const Value& state, const std::string& key, Value generator_state) {
  const std::string& kind = state.as_dict().at(key).as_dict().at("kind").as_string();
  return with_entry(state, key, entry_of(kind, std::move(generator_state)));
}

std::string text_state(const Value& state, const std::string& key) {
  return std::string(state.as_dict().at(key).as_dict().at("state").as_bytes());
}

std::vector<std::uint8_t> tensor_state(const Value& state, const std::string& key) {
  const std::vector<std::byte> bytes = state.as_dict().at(key).as_dict().at("state").as_tensor().contiguous_bytes();
  std::vector<std::uint8_t> out(bytes.size());
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

Value uint8_tensor(const std::vector<std::uint8_t>& bytes) {
  return Value::tensor(TensorData::from_bytes(DType::uint8, {static_cast<std::int64_t>(bytes.size())},
                                              std::as_bytes(std::span(bytes))));
}

std::string error_message_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// The poison check of every negative test: `state` is rejected with `code` by
// validate and by apply, and afterwards every generator is bit-identical.
void expect_rejected_without_change(Generators& live, const Value& state, ErrorCode code) {
  Snapshot before(live);
  EXPECT_ERROR_CODE(live.registry.validate(state), code);
  EXPECT_ERROR_CODE(live.registry.apply(state), code);
  const Value after = live.registry.capture(CaptureMode::copy);
  EXPECT_TRUE(equal_content(before.captured, after)) << describe_difference(before.captured, after);
  EXPECT_TRUE(live.draw_live() == before.draw_copies());
}

class RngRegistryTest : public ::testing::Test {
 protected:
  RngRegistryTest() : live(42) { live.advance(); }

  Generators live;
  TempDir dir;
};

TEST_F(RngRegistryTest, EveryGeneratorRoundTripsThroughAFileAndDrawsTheSame) {
  const auto path = dir / "rng.pt";
  save_mapping(path, live.registry.capture(CaptureMode::reference));
  const Draws expected = live.draw_live();

  // A fresh set of generators, seeded differently, stands in for a new process.
  Generators fresh(7);
  EXPECT_FALSE(fresh.draw_live() == expected);  // negative control: the test can see a difference
  const LoadedMapping loaded = load_checkpoint_mapping(path);
  fresh.registry.validate(loaded.root);
  fresh.registry.apply(loaded.root);
  EXPECT_TRUE(fresh.draw_live() == expected);
}

TEST_F(RngRegistryTest, ByteStatesWrittenAsTorch113TensorsAreAccepted) {
  const auto path = dir / "rng-113.pt";
  SaveOptions options;
  options.torch_1_13_compatible = true;  // bytes become 1-d uint8 tensors
  save_mapping(path, live.registry.capture(CaptureMode::reference), options);
  const Draws expected = live.draw_live();

  const LoadedMapping loaded = load_checkpoint_mapping(path);
  EXPECT_TRUE(loaded.root.as_dict().at("augment.mt").as_dict().at("state").is_tensor());
  live.registry.apply(loaded.root);
  EXPECT_TRUE(live.draw_live() == expected);
}

TEST_F(RngRegistryTest, CaptureNamesEveryGeneratorWithItsKind) {
  const Value inventory = live.registry.inventory();
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"torch.cpu", "torch.cpu"},       {"sampler", "torch.cpu"},    {"augment.mt", "std::mt19937"},
      {"augment.mt64", "std::mt19937_64"}, {"dropout.pcg", "pcg64"}, {"env.user", "user"}};
  ASSERT_EQ(inventory.as_dict().size(), expected.size());
  for (const auto& [name, kind] : expected) {
    EXPECT_EQ(inventory.as_dict().at(name).as_string(), kind) << name;
    EXPECT_TRUE(live.registry.contains(name));
  }
  EXPECT_FALSE(live.registry.contains("ghost"));
  const Value state = live.registry.capture(CaptureMode::reference);
  EXPECT_EQ(state.as_dict().at("sampler").as_dict().at("state").as_tensor().dtype, DType::uint8);
  EXPECT_THAT(text_state(state, "dropout.pcg"), ::testing::StartsWith("47026247687942121848144207491837523525 "));
}

TEST_F(RngRegistryTest, DuplicateAndEmptyNamesAreRefused) {
  std::mt19937 other;
  EXPECT_ERROR_CODE(live.registry.add("augment.mt", other), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(live.registry.add("", other), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(live.registry.add("torch.cpu", at::detail::getDefaultCPUGenerator()), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(live.registry.add("u", UserGenerator{}), ErrorCode::invalid_argument);
  EXPECT_EQ(live.registry.size(), 6u);
}

// ---- inventory: fail closed -----------------------------------------------------------

TEST_F(RngRegistryTest, RegisteredGeneratorMissingFromTheFileIsRejected) {
  const Value state = with_entry(live.registry.capture(CaptureMode::copy), "augment.mt", std::nullopt);
  expect_rejected_without_change(live, state, ErrorCode::rng_inventory_mismatch);
  EXPECT_THAT(error_message_of([&] { live.registry.validate(state); }), HasSubstr("'augment.mt'"));
}

TEST_F(RngRegistryTest, FileEntryWithoutARegisteredGeneratorIsRejected) {
  const Value captured = live.registry.capture(CaptureMode::copy);
  const Value state = with_entry(captured, "cuda.ghost", captured.as_dict().at("sampler"));
  expect_rejected_without_change(live, state, ErrorCode::rng_inventory_mismatch);
  EXPECT_THAT(error_message_of([&] { live.registry.validate(state); }), HasSubstr("'cuda.ghost'"));
}

TEST_F(RngRegistryTest, KindMismatchIsAnInventoryMismatch) {
  const Value captured = live.registry.capture(CaptureMode::copy);
  const Value state = with_entry(captured, "dropout.pcg", entry_of("std::mt19937", Value::bytes(text_state(captured, "augment.mt"))));
  expect_rejected_without_change(live, state, ErrorCode::rng_inventory_mismatch);
}

TEST_F(RngRegistryTest, OneMessageNamesEveryMissingExtraAndMismatchedGenerator) {
  Value state = live.registry.capture(CaptureMode::copy);
  state = with_entry(state, "augment.mt", std::nullopt);
  state = with_entry(state, "env.user", std::nullopt);
  state = with_entry(state, "ghost.a", entry_of("user", Value::bytes("12345678")));
  state = with_entry(state, "ghost.b", entry_of("pcg64", Value::bytes("1 2 3")));
  state = with_entry(state, "sampler", entry_of("torch.cuda", Value::bytes("")));
  expect_rejected_without_change(live, state, ErrorCode::rng_inventory_mismatch);
  const std::string message = error_message_of([&] { live.registry.validate(state); });
  for (const char* name : {"'augment.mt'", "'env.user'", "'ghost.a'", "'ghost.b'", "'sampler' is torch.cuda"}) {
    EXPECT_THAT(message, HasSubstr(name));
  }
}

TEST_F(RngRegistryTest, MalformedEntriesHaveFieldCodes) {
  const Value captured = live.registry.capture(CaptureMode::copy);
  expect_rejected_without_change(live, Value::list(), ErrorCode::state_type_invalid);
  expect_rejected_without_change(live, with_entry(captured, "augment.mt", Value::bytes("x")),
                                 ErrorCode::state_type_invalid);
  Dict no_state;
  no_state.insert("kind", Value::string("std::mt19937"));
  expect_rejected_without_change(live, with_entry(captured, "augment.mt", Value::dict(std::move(no_state))),
                                 ErrorCode::state_key_missing);
  Dict extra_key;
  extra_key.insert("kind", Value::string("std::mt19937"));
  extra_key.insert("state", Value::bytes(text_state(captured, "augment.mt")));
  extra_key.insert("seed", Value::integer(1));
  expect_rejected_without_change(live, with_entry(captured, "augment.mt", Value::dict(std::move(extra_key))),
                                 ErrorCode::state_key_unknown);
}

// ---- corrupted states -----------------------------------------------------------------

TEST_F(RngRegistryTest, CorruptedMt19937TextIsRejected) {
  const Value captured = live.registry.capture(CaptureMode::copy);
  const std::string text = text_state(captured, "augment.mt");
  const std::size_t first_space = text.find(' ');
  const std::vector<std::string> corrupted = {
      text.substr(0, text.rfind(' ')),                     // truncated: 624 numbers
      "4294967296" + text.substr(first_space),             // word 0 = 2^32
      text + " 7",                                         // one number too many
      text + "x",                                          // trailing garbage
      text + "\n",                                         // trailing whitespace
      " " + text,                                          // leading whitespace
      "0" + text,                                          // non-canonical leading zero
      "-1" + text.substr(first_space),                     // sign
      text.substr(0, text.rfind(' ')) + " 625",            // position beyond the state
      text.substr(0, first_space) + "  " + text.substr(first_space + 1),  // double space
      "",
  };
  for (const std::string& bad : corrupted) {
    SCOPED_TRACE(bad.substr(0, 40) + "..." + bad.substr(bad.size() > 40 ? bad.size() - 40 : 0));
    expect_rejected_without_change(live, with_state(captured, "augment.mt", Value::bytes(bad)),
                                   ErrorCode::rng_state_invalid);
  }
  // A well-formed std::mt19937_64 text is not an std::mt19937 state.
  expect_rejected_without_change(
      live, with_state(captured, "augment.mt", Value::bytes(text_state(captured, "augment.mt64"))),
      ErrorCode::rng_state_invalid);
}

TEST_F(RngRegistryTest, CorruptedMt19937_64TextIsRejected) {
  const Value captured = live.registry.capture(CaptureMode::copy);
  const std::string text = text_state(captured, "augment.mt64");
  const std::size_t first_space = text.find(' ');
  for (const std::string& bad : {text.substr(0, text.rfind(' ')), "18446744073709551616" + text.substr(first_space),
                                 text.substr(0, text.rfind(' ')) + " 313", text + " 0"}) {
    expect_rejected_without_change(live, with_state(captured, "augment.mt64", Value::bytes(bad)),
                                   ErrorCode::rng_state_invalid);
  }
}

TEST_F(RngRegistryTest, CorruptedPcg64TextIsRejected) {
  const Value captured = live.registry.capture(CaptureMode::copy);
  const std::string text = text_state(captured, "dropout.pcg");
  const std::size_t a = text.find(' ');
  const std::size_t b = text.find(' ', a + 1);
  const std::string multiplier = text.substr(0, a);
  const std::string increment = text.substr(a + 1, b - a - 1);
  const std::string even_increment = increment.substr(0, increment.size() - 1) + "2";
  for (const std::string& bad : {
           text.substr(0, b),                                                   // two numbers
           text + " 1",                                                         // four numbers
           "3" + text.substr(a),                                                // another multiplier
           multiplier + " " + even_increment + text.substr(b),                  // even increment
           text.substr(0, b) + " 340282366920938463463374607431768211456",      // state = 2^128
           text.substr(0, b) + " 0" + text.substr(b + 1),                       // leading zero
           text + "\n",
       }) {
    expect_rejected_without_change(live, with_state(captured, "dropout.pcg", Value::bytes(bad)),
                                   ErrorCode::rng_state_invalid);
  }
}

// Offsets in LibTorch's CPU generator state (CPUGeneratorImplState).
constexpr std::size_t kLeftOffset = 8;
constexpr std::size_t kNextOffset = 16;
constexpr std::size_t kWordsOffset = 24;
constexpr std::size_t kNormalValidOffset = 5040;
constexpr std::size_t kFloatNormalValidOffset = 5052;
constexpr std::size_t kPaddingOffset = 5054;

template <typename T>
std::vector<std::uint8_t> patched(std::vector<std::uint8_t> bytes, std::size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof value);
  return bytes;
}

TEST_F(RngRegistryTest, CorruptedTorchGeneratorStatesAreRejected) {
  const Value captured = live.registry.capture(CaptureMode::copy);
  for (const std::string key : {"torch.cpu", "sampler"}) {
    SCOPED_TRACE(key);
    const std::vector<std::uint8_t> state = tensor_state(captured, key);
    ASSERT_EQ(state.size(), 5056u);
    std::vector<std::uint8_t> shorter(state.begin(), state.end() - 1);
    std::vector<std::uint8_t> longer = state;
    longer.push_back(0);
    const std::vector<Value> corrupted = {
        uint8_tensor(shorter),
        uint8_tensor(longer),
        uint8_tensor(patched(state, kLeftOffset, std::int32_t{0})),       // left outside 1..624
        uint8_tensor(patched(state, kLeftOffset, std::int32_t{625})),
        uint8_tensor(patched(patched(state, kLeftOffset, std::int32_t{300}), kNextOffset, std::uint64_t{400})),
        uint8_tensor(patched(state, kNextOffset, std::uint64_t{1} << 40)),  // next past the array
        uint8_tensor(patched(state, kWordsOffset + 8 * 5, std::uint64_t{1} << 32)),  // word 5 = 2^32
        uint8_tensor(patched(state, kFloatNormalValidOffset, std::uint8_t{2})),  // a bool that is 2
        uint8_tensor(patched(state, kNormalValidOffset, std::int32_t{7})),       // normalised by LibTorch
        uint8_tensor(patched(state, kPaddingOffset, std::uint8_t{0xAB})),        // padding set
        // The same bytes as float32 values: wrong dtype.
        Value::tensor(TensorData::from_bytes(DType::float32, {static_cast<std::int64_t>(state.size() / 4)},
                                             std::as_bytes(std::span(state)))),
        // A 2-d uint8 tensor.
        Value::tensor(TensorData::from_bytes(DType::uint8, {2, static_cast<std::int64_t>(state.size() / 2)},
                                             std::as_bytes(std::span(state)))),
        Value::string("not a state"),
        Value::integer(5056),
    };
    for (std::size_t i = 0; i < corrupted.size(); ++i) {
      SCOPED_TRACE(i);
      expect_rejected_without_change(live, with_state(captured, key, corrupted[i]), ErrorCode::rng_state_invalid);
    }
  }
}

TEST_F(RngRegistryTest, UserGeneratorRejectionIsAStateError) {
  const Value captured = live.registry.capture(CaptureMode::copy);
  expect_rejected_without_change(live, with_state(captured, "env.user", Value::bytes("1234567")),
                                 ErrorCode::rng_state_invalid);
  EXPECT_THAT(error_message_of([&] { live.registry.validate(with_state(captured, "env.user", Value::bytes(""))); }),
              HasSubstr("an LCG state is 8 bytes"));
}

TEST_F(RngRegistryTest, OneBadStateAmongGoodOnesChangesNoGenerator) {
  // The bad state is the last one registered: apply must not have set the others first.
  const Value captured = live.registry.capture(CaptureMode::copy);
  live.advance();
  expect_rejected_without_change(live, with_state(captured, "env.user", Value::bytes("short")),
                                 ErrorCode::rng_state_invalid);
}

}  // namespace
}  // namespace holdpoint
