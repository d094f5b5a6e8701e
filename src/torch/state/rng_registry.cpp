#include "holdpoint/state/rng_registry.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <charconv>
#include <cstddef>
#include <cstring>
#include <locale>
#include <mutex>
#include <sstream>

#include "holdpoint/schema/resume_profile.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "state/state_fields.h"

namespace holdpoint {

namespace {

std::string state_path(const std::string& name) { return "rng." + name + ".state"; }

template <typename... Parts>
[[noreturn]] void invalid_state(const std::string& name, Parts&&... parts) {
  state::state_error(ErrorCode::rng_state_invalid, state_path(name), ": ", std::forward<Parts>(parts)...);
}

// The state as bytes, from bytes or from a 1-d uint8 tensor (the torch 1.13
// compatible encoding of bytes, and the form of Generator::get_state).
std::string state_bytes(const Value& state, const std::string& name) {
  if (state.is_bytes()) return std::string(state.as_bytes());
  if (!state.is_tensor()) invalid_state(name, "is a ", value_kind_name(state.kind()), ", not bytes or a uint8 tensor");
  const TensorData& tensor = state.as_tensor();
  if (tensor.dtype != DType::uint8 || tensor.sizes.size() != 1) {
    invalid_state(name, "is a ", tensor.sizes.size(), "-d ", dtype_name(tensor.dtype),
                  " tensor, not a 1-d uint8 tensor");
  }
  const std::vector<std::byte> bytes = tensor.contiguous_bytes();
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

at::Tensor byte_tensor(std::string_view bytes) {
  at::Tensor tensor = at::empty({static_cast<std::int64_t>(bytes.size())}, at::kByte);
  std::memcpy(tensor.data_ptr(), bytes.data(), bytes.size());
  return tensor;
}

std::string tensor_bytes(const at::Tensor& tensor) {
  const at::Tensor contiguous = tensor.contiguous();
  return std::string(static_cast<const char*>(contiguous.data_ptr()), contiguous.numel());
}

// ---- LibTorch generators ------------------------------------------------------

// The layout of LibTorch's CPU generator state (at::detail::CPUGeneratorImplState
// in ATen/CPUGeneratorImpl.cpp as of 1.13; the adapter refuses a LibTorch whose
// state has another size), mirrored because set_state trusts the engine's
// position fields: a position outside the state array makes the next draw
// read out of bounds, so those are checked before LibTorch sees the bytes.
struct CpuGeneratorLegacyLayout {
  std::uint64_t the_initial_seed;
  int left;
  int seeded;
  std::uint64_t next;
  std::uint64_t state[at::MERSENNE_STATE_N];
  double normal_x;
  double normal_y;
  double normal_rho;
  int normal_is_valid;
};
struct CpuGeneratorLayout {
  CpuGeneratorLegacyLayout legacy;
  float next_float_normal_sample;
  std::uint8_t is_next_float_normal_sample_valid;  // a bool in LibTorch; read as a byte to check it
};

void check_cpu_generator_layout(std::string_view bytes, const std::string& name) {
  CpuGeneratorLayout layout;
  std::memcpy(&layout, bytes.data(), sizeof layout);
  const CpuGeneratorLegacyLayout& engine = layout.legacy;
  constexpr int n = static_cast<int>(at::MERSENNE_STATE_N);
  // mt19937 reads state[next] after decrementing left, regenerating when it
  // reaches 0, so the left - 1 reads before regeneration stay in bounds iff
  // next + left <= n + 1.
  if (engine.left < 1 || engine.left > n || engine.next > static_cast<std::uint64_t>(n) ||
      engine.next + static_cast<std::uint64_t>(engine.left) > static_cast<std::uint64_t>(n) + 1) {
    invalid_state(name, "mt19937 position left = ", engine.left, ", next = ", engine.next,
                  " is outside the state array (left in 1..", n, ", left + next <= ", n + 1, ")");
  }
  for (int i = 0; i < n; ++i) {
    if (engine.state[i] > 0xFFFFFFFFu) {
      invalid_state(name, "mt19937 word ", i, " = ", engine.state[i], " exceeds 2^32 - 1");
    }
  }
  if (layout.is_next_float_normal_sample_valid > 1) {
    invalid_state(name, "is_next_float_normal_sample_valid = ",
                  static_cast<int>(layout.is_next_float_normal_sample_valid), " is not a bool");
  }
}

class TorchGeneratorSource final : public RandomSource {
 public:
  TorchGeneratorSource(std::string name, at::Generator generator)
      : name_(std::move(name)), generator_(std::move(generator)) {
    if (!generator_.defined()) state::state_error(ErrorCode::invalid_argument, "generator '", name_, "' is undefined");
    const c10::DeviceType device = generator_.device().type();
    if (device == c10::DeviceType::CPU) {
      kind_ = "torch.cpu";
      const std::int64_t size = live_state().numel();
      if (size != static_cast<std::int64_t>(sizeof(CpuGeneratorLayout))) {
        state::state_error(ErrorCode::invalid_argument, "generator '", name_, "': this LibTorch's CPU generator state is ",
                           size, " bytes, not the ", sizeof(CpuGeneratorLayout), " bytes of the layout holdpoint checks");
      }
    } else if (device == c10::DeviceType::CUDA) {
      kind_ = "torch.cuda";
    } else {
      state::state_error(ErrorCode::invalid_argument, "generator '", name_, "' is on ", c10::DeviceTypeName(device),
                         ", not CPU or CUDA");
    }
  }

  const std::string& name() const override { return name_; }
  const std::string& kind() const override { return kind_; }
  Value get_state() const override { return tensor_value(live_state()); }
  const void* generator_identity() const override { return generator_.unsafeGetGeneratorImpl(); }

  void validate_state(const Value& state) const override {
    const std::string bytes = state_bytes(state, name_);
    const std::int64_t expected = live_state().numel();
    if (static_cast<std::int64_t>(bytes.size()) != expected) {
      invalid_state(name_, "is ", bytes.size(), " bytes, a ", kind_, " generator state is ", expected);
    }
    if (kind_ == "torch.cpu") check_cpu_generator_layout(bytes, name_);
    // LibTorch checks the rest; a clone takes the state so the live generator
    // is untouched, and must give back exactly these bytes (fields LibTorch
    // would drop or normalise mean the file is not one get_state wrote).
    at::Generator trial = locked_clone();
    try {
      trial.set_state(byte_tensor(bytes));
    } catch (const c10::Error& error) {
      invalid_state(name_, "LibTorch rejects it: ", error.what_without_backtrace());
    }
    if (tensor_bytes(trial.get_state()) != bytes) {
      invalid_state(name_, "does not restore to the same bytes (fields outside their range or padding set)");
    }
  }

  void set_state(const Value& state) override {
    const at::Tensor tensor = byte_tensor(state_bytes(state, name_));
    at::Generator generator = generator_;
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(tensor);
  }

 private:
  at::Tensor live_state() const {
    at::Generator generator = generator_;
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  }

  at::Generator locked_clone() const {
    at::Generator generator = generator_;
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.clone();
  }

  std::string name_;
  std::string kind_;
  at::Generator generator_;
};

// ---- engines with a textual state ---------------------------------------------

template <typename Engine>
std::string text_of(const Engine& engine) {
  std::ostringstream out;
  out.imbue(std::locale::classic());  // a global locale with digit grouping would change the text
  out << engine;
  return out.str();
}

// Splits `text` into exactly `count` decimal numbers separated by single
// spaces: the form operator<< writes, with nothing before, between or after.
std::vector<std::string_view> decimal_tokens(std::string_view text, std::size_t count, const std::string& name) {
  std::vector<std::string_view> tokens;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = std::min(text.find(' ', start), text.size());
    const std::string_view token = text.substr(start, end - start);
    if (token.empty()) invalid_state(name, "has an empty number at offset ", start);
    for (std::size_t i = 0; i < token.size(); ++i) {
      if (token[i] < '0' || token[i] > '9') {
        invalid_state(name, "has a byte that is not a digit or a single space at offset ", start + i);
      }
    }
    tokens.push_back(token);
    if (tokens.size() > count) invalid_state(name, "has more than the ", count, " numbers of its engine");
    if (end == text.size()) break;
    start = end + 1;
  }
  if (tokens.size() != count) invalid_state(name, "has ", tokens.size(), " numbers, its engine ", count);
  return tokens;
}

// Reads `text` into a fresh engine and requires it to be exactly the text
// operator<< writes for the result: a non-canonical spelling (leading zeros)
// could restore something other than what was saved.
template <typename Engine>
Engine engine_from_text(std::string_view text, const std::string& name) {
  Engine engine;
  std::istringstream in{std::string(text)};
  in.imbue(std::locale::classic());
  in >> engine;
  if (in.fail()) invalid_state(name, "the engine does not accept it");
  if (text_of(engine) != text) invalid_state(name, "is not the canonical text of the state it restores");
  return engine;
}

// std::mt19937 / std::mt19937_64: n words then the position (libstdc++ form).
template <typename Engine>
Engine parse_mersenne_text(std::string_view text, const std::string& name) {
  constexpr std::size_t n = Engine::state_size;
  const std::vector<std::string_view> tokens = decimal_tokens(text, n + 1, name);
  for (std::size_t i = 0; i <= n; ++i) {
    std::uint64_t value = 0;
    const auto [end, error] = std::from_chars(tokens[i].data(), tokens[i].data() + tokens[i].size(), value);
    // The engine stores words in uint_fast32_t, 64 bits wide here, so it
    // would keep an out-of-range word as it is rather than reject it.
    const std::uint64_t bound = i < n ? std::uint64_t{Engine::max()} : n;
    if (error == std::errc() && value <= bound) continue;
    if (i < n) invalid_state(name, "word ", i, " = ", tokens[i], " exceeds ", bound);
    invalid_state(name, "position ", tokens[i], " exceeds ", n);
  }
  return engine_from_text<Engine>(text, name);
}

// pcg64's own stream operators do not compile in C++20 (inside pcg_detail
// the engine's operator<< hides pcg_extras' 128-bit one), so the adapter
// writes the same text, "multiplier increment state" in decimal, itself.
// The state and multiplier are protected; a derived class may name them.
using pcg_extras::pcg128_t;
struct Pcg64Internals : pcg64 {
  static constexpr pcg128_t pcg64::*state = &Pcg64Internals::state_;
  static constexpr pcg128_t multiplier() { return pcg64::multiplier(); }
};

std::string decimal_of(pcg128_t value) {
  std::string digits;
  do {
    digits.push_back(static_cast<char>('0' + static_cast<int>(value % 10)));
    value /= 10;
  } while (value != 0);
  return {digits.rbegin(), digits.rend()};
}

pcg128_t parse_u128(std::string_view token, std::string_view field, const std::string& name) {
  if (token.size() > 1 && token[0] == '0') invalid_state(name, field, " ", token, " has a leading zero");
  constexpr pcg128_t max = ~pcg128_t{0};
  pcg128_t value = 0;
  for (char c : token) {
    const unsigned digit = static_cast<unsigned>(c - '0');
    if (value > (max - digit) / 10) invalid_state(name, field, " ", token, " exceeds 2^128 - 1");
    value = value * 10 + digit;
  }
  return value;
}

std::string pcg64_text(const pcg64& engine) {
  pcg64 copy = engine;  // stream() is not const
  const pcg128_t increment = (copy.stream() << 1) | 1;
  return decimal_of(Pcg64Internals::multiplier()) + " " + decimal_of(increment) + " " +
         decimal_of(engine.*Pcg64Internals::state);
}

pcg64 parse_pcg64_text(std::string_view text, const std::string& name) {
  const std::vector<std::string_view> tokens = decimal_tokens(text, 3, name);
  if (parse_u128(tokens[0], "multiplier", name) != Pcg64Internals::multiplier()) {
    invalid_state(name, "multiplier ", tokens[0], " is not pcg64's");
  }
  const pcg128_t increment = parse_u128(tokens[1], "increment", name);
  // The engine keeps increments odd: an even one would restore another stream.
  if (increment % 2 == 0) invalid_state(name, "increment ", tokens[1], " is even");
  pcg64 engine;
  engine.set_stream(increment >> 1);
  engine.*Pcg64Internals::state = parse_u128(tokens[2], "state", name);
  return engine;
}

template <typename Engine, std::string (*to_text)(const Engine&),
          Engine (*parse)(std::string_view, const std::string&)>
class TextEngineSource final : public RandomSource {
 public:
  TextEngineSource(std::string name, std::string kind, Engine& engine)
      : name_(std::move(name)), kind_(std::move(kind)), engine_(engine) {}

  const std::string& name() const override { return name_; }
  const std::string& kind() const override { return kind_; }
  Value get_state() const override { return Value::bytes(to_text(engine_)); }
  void validate_state(const Value& state) const override { parse(state_bytes(state, name_), name_); }
  void set_state(const Value& state) override { engine_ = parse(state_bytes(state, name_), name_); }

 private:
  std::string name_;
  std::string kind_;
  Engine& engine_;
};

using Mt19937Source = TextEngineSource<std::mt19937, text_of<std::mt19937>, parse_mersenne_text<std::mt19937>>;
using Mt19937_64Source =
    TextEngineSource<std::mt19937_64, text_of<std::mt19937_64>, parse_mersenne_text<std::mt19937_64>>;
using Pcg64Source = TextEngineSource<pcg64, pcg64_text, parse_pcg64_text>;

// ---- user generators ------------------------------------------------------------

class UserGeneratorSource final : public RandomSource {
 public:
  UserGeneratorSource(std::string name, UserGenerator generator)
      : name_(std::move(name)), generator_(std::move(generator)) {
    if (!generator_.get_state || !generator_.validate_state || !generator_.set_state) {
      state::state_error(ErrorCode::invalid_argument, "user generator '", name_, "' lacks a callback");
    }
  }

  const std::string& name() const override { return name_; }
  const std::string& kind() const override { return kind_; }
  Value get_state() const override { return Value::bytes(generator_.get_state()); }

  void validate_state(const Value& state) const override {
    const std::string bytes = state_bytes(state, name_);
    try {
      generator_.validate_state(bytes);
    } catch (const std::exception& error) {
      invalid_state(name_, error.what());
    }
  }

  void set_state(const Value& state) override { generator_.set_state(state_bytes(state, name_)); }

 private:
  std::string name_;
  std::string kind_ = "user";
  UserGenerator generator_;
};

}  // namespace

// ---- registry -------------------------------------------------------------------

void RngRegistry::add(std::unique_ptr<RandomSource> source) {
  if (!source) state::state_error(ErrorCode::invalid_argument, "rng: null random source");
  if (source->name().empty()) state::state_error(ErrorCode::invalid_argument, "rng: a generator name is empty");
  if (find(source->name())) {
    state::state_error(ErrorCode::invalid_argument, "rng: generator '", source->name(), "' is already registered");
  }
  sources_.push_back(std::move(source));
}

void RngRegistry::add(std::string name, at::Generator generator) {
  add(std::make_unique<TorchGeneratorSource>(std::move(name), std::move(generator)));
}
void RngRegistry::add(std::string name, std::mt19937& engine) {
  add(std::make_unique<Mt19937Source>(std::move(name), "std::mt19937", engine));
}
void RngRegistry::add(std::string name, std::mt19937_64& engine) {
  add(std::make_unique<Mt19937_64Source>(std::move(name), "std::mt19937_64", engine));
}
void RngRegistry::add(std::string name, pcg64& engine) {
  add(std::make_unique<Pcg64Source>(std::move(name), "pcg64", engine));
}
void RngRegistry::add(std::string name, UserGenerator generator) {
  add(std::make_unique<UserGeneratorSource>(std::move(name), std::move(generator)));
}

const RandomSource* RngRegistry::find(std::string_view name) const {
  for (const auto& source : sources_) {
    if (source->name() == name) return source.get();
  }
  return nullptr;
}

bool RngRegistry::contains(std::string_view name) const { return find(name) != nullptr; }

Value RngRegistry::inventory() const {
  Dict entries;
  for (const auto& source : sources_) entries.insert(source->name(), Value::string(source->kind()));
  return Value::dict(std::move(entries));
}

Value RngRegistry::capture(CaptureMode) const {
  // Every get_state returns storage of its own, so both modes are copies.
  Dict entries;
  for (const auto& source : sources_) {
    Dict entry;
    entry.insert("kind", Value::string(source->kind()));
    entry.insert("state", source->get_state());
    entries.insert(source->name(), Value::dict(std::move(entry)));
  }
  return Value::dict(std::move(entries));
}

void RngRegistry::validate(const Value& value) const {
  const state::FieldReader file(value, name_);
  // The whole inventory difference in one message, so one failed resume shows
  // every generator that would have been left unrestored or ignored.
  std::vector<std::string> missing;
  std::vector<std::string> unregistered;
  std::vector<std::string> kind_mismatches;
  for (const auto& source : sources_) {
    const Value* entry = file.optional(source->name());
    if (!entry) {
      missing.push_back("'" + source->name() + "'");
      continue;
    }
    const Value* kind = entry->is_dict() ? entry->as_dict().find(std::string_view("kind")) : nullptr;
    if (kind && kind->is_string() && kind->as_string() != source->kind()) {
      kind_mismatches.push_back("'" + source->name() + "' is " + kind->as_string() + " in the file, " +
                                source->kind() + " registered");
    }
  }
  for (const auto& [key, entry] : file.dict()) {
    if (!key.is_string()) {
      unregistered.push_back(key.to_string());
    } else if (!find(key.as_string())) {
      unregistered.push_back("'" + key.as_string() + "'");
    }
  }
  if (!missing.empty() || !unregistered.empty() || !kind_mismatches.empty()) {
    std::string message;
    const auto add_part = [&](const char* label, const std::vector<std::string>& items) {
      if (items.empty()) return;
      message += message.empty() ? "" : "; ";
      message += label;
      for (std::size_t i = 0; i < items.size(); ++i) message += (i ? ", " : "") + items[i];
    };
    add_part("registered but not in the file: ", missing);
    add_part("in the file but not registered: ", unregistered);
    add_part("kind differs: ", kind_mismatches);
    state::state_error(ErrorCode::rng_inventory_mismatch, name_, ": ", message);
  }
  for (const auto& source : sources_) {
    const state::FieldReader entry = file.child(source->name());
    entry.allow_only({"kind", "state"});
    if (entry.string("kind") != source->kind()) {
      state::state_error(ErrorCode::rng_inventory_mismatch, entry.path_of("kind"), " is ", entry.string("kind"),
                         ", registered as ", source->kind());
    }
    source->validate_state(entry.required("state"));
  }
}

void RngRegistry::apply(const Value& value) {
  validate(value);
  const Dict& entries = value.as_dict();
  for (const auto& source : sources_) source->set_state(entries.at(source->name()).as_dict().at(DictKey("state")));
}

void RngRegistry::describe(ProfileFacts& facts) const {
  const void* cpu_default = at::detail::getDefaultCPUGenerator().unsafeGetGeneratorImpl();
  std::size_t cuda_defaults = 0;
  const std::size_t devices = at::hasCUDA() ? at::getNumGPUs() : 0;
  for (const auto& source : sources_) {
    const void* identity = source->generator_identity();
    if (!identity) continue;
    facts.registered_generators.push_back(identity);
    if (identity == cpu_default) facts.cpu_generator_registered = true;
    for (std::size_t device = 0; device < devices; ++device) {
      const c10::Device cuda(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
      if (identity == at::globalContext().defaultGenerator(cuda).unsafeGetGeneratorImpl()) ++cuda_defaults;
    }
  }
  facts.all_cuda_generators_registered = cuda_defaults == devices;
}

void register_default_generators(RngRegistry& registry) {
  registry.add("torch.cpu", at::detail::getDefaultCPUGenerator());
  if (!at::hasCUDA()) return;
  for (std::size_t device = 0; device < at::getNumGPUs(); ++device) {
    const c10::Device cuda(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    registry.add("torch.cuda:" + std::to_string(device), at::globalContext().defaultGenerator(cuda));
  }
}

}  // namespace holdpoint
