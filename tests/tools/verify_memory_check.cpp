// Proves that `holdpoint verify` streams: writes a valid checkpoint of SIZE_MIB
// MiB, runs `holdpoint verify` on it as a fresh process whose address space is
// capped at LIMIT_MIB (ulimit -v), and checks that it succeeds and that its
// peak RSS exceeds that of the same command on a 1 MiB checkpoint by at most
// EXTRA_MIB. The files are deleted afterwards, whatever happens.
//
//   verify_memory_check HOLDPOINT SIZE_MIB LIMIT_MIB EXTRA_MIB [--large]
//                       [--expect-exceeded] [-- ARGUMENTS...]
//
// ARGUMENTS replace `verify` (the file is appended). --expect-exceeded is the
// negative control: the command must fail under the cap or exceed the bound
// (a read that holds the file in memory, `inspect --digests`, does). With
// --large it runs only when HOLDPOINT_LARGE_TESTS=1. Exit 0: passed;
// 1: failed; 77: skipped (not enabled, or not enough free disk space).
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "holdpoint/format/checkpoint_mapping.h"

namespace {

constexpr int kSkipped = 77;

struct Run {
  int status = -1;
  long max_rss_kib = 0;
  std::string output;
  double seconds = 0;
};

// Runs `holdpoint ARGUMENTS... FILE` with RLIMIT_AS = limit_mib and returns its
// exit status, peak RSS (wait4's ru_maxrss) and output.
Run run_holdpoint(const std::string& holdpoint, const std::vector<std::string>& arguments,
                  const std::filesystem::path& file, std::uint64_t limit_mib,
                  const std::filesystem::path& output_file) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(holdpoint.c_str()));
  for (const std::string& argument : arguments) argv.push_back(const_cast<char*>(argument.c_str()));
  argv.push_back(const_cast<char*>(file.c_str()));
  argv.push_back(nullptr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t child = ::fork();
  if (child == 0) {
    rlimit limit{};
    limit.rlim_cur = limit.rlim_max = static_cast<rlim_t>(limit_mib) << 20;
    if (::setrlimit(RLIMIT_AS, &limit) != 0) _exit(125);
    // glibc reserves 64 MiB of address space per thread arena; two arenas
    // are enough for a reader and a hasher.
    ::setenv("MALLOC_ARENA_MAX", "2", 1);
    std::FILE* out = std::freopen(output_file.c_str(), "w", stdout);
    if (out == nullptr || ::dup2(STDOUT_FILENO, STDERR_FILENO) < 0) _exit(126);
    ::execv(holdpoint.c_str(), argv.data());
    _exit(127);
  }
  Run run;
  rusage usage{};
  int status = 0;
  if (child < 0 || ::wait4(child, &status, 0, &usage) != child) return run;
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.max_rss_kib = usage.ru_maxrss;
  // The first line says what happened ("valid: ...", "error: ...").
  if (std::FILE* in = std::fopen(output_file.c_str(), "r")) {
    char line[4096];
    if (std::fgets(line, sizeof line, in) != nullptr) run.output = line;
    std::fclose(in);
  }
  if (run.output.empty() || run.output.back() != '\n') run.output += '\n';
  return run;
}

// A float32 tensor of `mib` MiB whose bytes are an untouched anonymous
// mapping: every page reads as the shared zero page, so writing the file
// costs no resident memory.
void write_checkpoint(const std::filesystem::path& path, std::uint64_t mib) {
  const std::size_t bytes = static_cast<std::size_t>(mib) << 20;
  void* memory = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (memory == MAP_FAILED) throw std::runtime_error(std::string("mmap: ") + std::strerror(errno));
  std::shared_ptr<void> mapping(memory, [bytes](void* p) { ::munmap(p, bytes); });
  holdpoint::TensorData weight;
  weight.dtype = holdpoint::DType::float32;
  weight.sizes = {static_cast<std::int64_t>(bytes / 4)};
  weight.strides = {1};
  weight.storage = std::make_shared<const holdpoint::Storage>(static_cast<const std::byte*>(memory), bytes, mapping);
  const float bias_values[3] = {0.5f, -1.5f, 2.5f};
  holdpoint::Dict model;
  model.insert("weight", holdpoint::Value::tensor(std::move(weight)));
  model.insert("bias", holdpoint::Value::tensor(holdpoint::TensorData::from_bytes(
                           holdpoint::DType::float32, {3},
                           {reinterpret_cast<const std::byte*>(bias_values), sizeof bias_values})));
  holdpoint::Dict root;
  root.insert("model", holdpoint::Value::ordered_dict(std::move(model)));
  root.insert("epoch", holdpoint::Value::integer(3));
  holdpoint::SaveOptions options;
  options.durable = false;
  options.write_sidecar = false;
  holdpoint::save_mapping(path, holdpoint::Value::dict(std::move(root)), options);
}

struct Check {
  std::string holdpoint;
  std::uint64_t size_mib = 0;
  std::uint64_t limit_mib = 0;
  std::uint64_t extra_mib = 0;
  bool expect_exceeded = false;
  std::vector<std::string> arguments{"verify"};
};

int check(const Check& c, const std::filesystem::path& dir) {
  const std::uint64_t size_mib = c.size_mib;
  const std::uint64_t limit_mib = c.limit_mib;
  const std::uint64_t extra_mib = c.extra_mib;
  const auto small = dir / "small.pt";
  const auto large = dir / "large.pt";
  write_checkpoint(small, 1);
  const auto write_start = std::chrono::steady_clock::now();
  write_checkpoint(large, size_mib);
  const double write_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - write_start).count();
  const Run baseline = run_holdpoint(c.holdpoint, c.arguments, small, limit_mib, dir / "small.out");
  const Run big = run_holdpoint(c.holdpoint, c.arguments, large, limit_mib, dir / "large.out");
  const long extra_kib = big.max_rss_kib - baseline.max_rss_kib;
  std::printf("wrote %llu MiB in %.1f s\n", static_cast<unsigned long long>(size_mib), write_seconds);
  std::string command;
  for (const std::string& argument : c.arguments) command += " " + argument;
  std::printf("holdpoint%s, as a fresh process\n", command.c_str());
  std::printf("1 MiB file: exit %d, max RSS %ld KiB: %s", baseline.status, baseline.max_rss_kib,
              baseline.output.c_str());
  std::printf("%llu MiB file under ulimit -v %llu MiB: exit %d in %.1f s, max RSS %ld KiB (%ld KiB more): %s",
              static_cast<unsigned long long>(size_mib), static_cast<unsigned long long>(limit_mib), big.status,
              big.seconds, big.max_rss_kib, extra_kib, big.output.c_str());
  if (baseline.status != 0) {
    std::printf("FAILED: the command did not succeed on the 1 MiB file\n");
    return 1;
  }
  const bool within = big.status == 0 && extra_kib <= static_cast<long>(extra_mib << 10);
  if (c.expect_exceeded) {
    if (within) std::printf("FAILED: the negative control stayed within the bound; the check cannot tell\n");
    return within ? 1 : 0;
  }
  if (big.status != 0) {
    std::printf("FAILED: the command did not succeed on the %llu MiB file under the address-space limit\n",
                static_cast<unsigned long long>(size_mib));
  } else if (!within) {
    std::printf("FAILED: peak RSS grew by %ld KiB, above the bound of %llu MiB\n", extra_kib,
                static_cast<unsigned long long>(extra_mib));
  }
  return within ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr,
                 "usage: verify_memory_check HOLDPOINT SIZE_MIB LIMIT_MIB EXTRA_MIB [--large] [--expect-exceeded] "
                 "[-- ARGUMENTS...]\n");
    return 2;
  }
  Check c;
  c.holdpoint = argv[1];
  c.size_mib = std::strtoull(argv[2], nullptr, 10);
  c.limit_mib = std::strtoull(argv[3], nullptr, 10);
  c.extra_mib = std::strtoull(argv[4], nullptr, 10);
  const std::uint64_t size_mib = c.size_mib;
  bool large = false;
  for (int i = 5; i < argc; ++i) {
    const std::string_view argument = argv[i];
    if (argument == "--large") {
      large = true;
    } else if (argument == "--expect-exceeded") {
      c.expect_exceeded = true;
    } else if (argument == "--") {
      c.arguments.assign(argv + i + 1, argv + argc);
      break;
    } else {
      std::fprintf(stderr, "verify_memory_check: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (large) {
    const char* enabled = std::getenv("HOLDPOINT_LARGE_TESTS");
    if (enabled == nullptr || std::string_view(enabled) != "1") {
      std::printf("skipped: set HOLDPOINT_LARGE_TESTS=1 to write a %llu MiB file\n",
                  static_cast<unsigned long long>(size_mib));
      return kSkipped;
    }
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/holdpoint-memory-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::filesystem::path dir(pattern);
  int result = 1;
  try {
    const std::uint64_t needed = (size_mib + 256) << 20;
    if (std::filesystem::space(dir).available < needed) {
      std::printf("skipped: needs %llu MiB free under %s\n", static_cast<unsigned long long>(needed >> 20),
                  dir.c_str());
      result = kSkipped;
    } else {
      result = check(c, dir);
    }
  } catch (const std::exception& error) {
    std::printf("FAILED: %s\n", error.what());
    result = 1;
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return result;
}
