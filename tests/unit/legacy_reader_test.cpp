// The legacy (non-zip) stream reader: every legacy file of the real corpus,
// files written by torch 2.13 (the oracle Python) with _use_new_zipfile_serialization=False
// compared element by element, each rejection with its code, and the hostile
// corpus refused quickly and without large allocations.
#include "format/pickle/legacy_reader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "format/pickle/pickle_opcodes.h"
#include "format/pickle/pickle_reader.h"
#include "holdpoint/base/error.h"
#include "support/test_support.h"
#include "unit/pickle_builder.h"

// Allocation accounting for the hostile-corpus test: every operator new of
// this binary goes through here.
namespace {
std::atomic<std::size_t> g_largest_allocation{0};
std::atomic<std::size_t> g_allocated_bytes{0};
}  // namespace

// noinline: GCC would otherwise see free() paired with `new` at inlined call
// sites and warn (-Wmismatched-new-delete), though the pair is this malloc.
__attribute__((noinline)) void* operator new(std::size_t size) {
  g_allocated_bytes += size;
  std::size_t largest = g_largest_allocation.load();
  while (size > largest && !g_largest_allocation.compare_exchange_weak(largest, size)) {
  }
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
__attribute__((noinline)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace holdpoint::format {
namespace {

using holdpoint::testing::corpus_dir;
using holdpoint::testing::PickleBuilder;
using holdpoint::testing::read_file_bytes;
namespace op = pickle_op;

LegacyStream read_bytes(const std::vector<std::byte>& bytes, const Limits& limits = {}) {
  auto owner = std::make_shared<std::vector<std::byte>>(bytes);
  return read_legacy_stream(*owner, owner, limits);
}

LegacyStream read_corpus(const std::string& name) {
  return read_bytes(read_file_bytes(corpus_dir() / "real_pt" / name));
}

std::vector<float> floats_of(const TensorData& tensor) {
  const auto bytes = tensor.contiguous_bytes();
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// ==== the real corpus ===========================================================================

TEST(LegacyReader, ReadsTorch13SmallTensorFiles) {
  // Values confirmed with pickletools and the raw storage bytes at the file end.
  {
    const LegacyStream s = read_corpus("gopickle_t1.5_legacy_float64_proto1.pt");  // protocol 1: text LONG magic
    const TensorData& t = s.root.as_tensor();
    EXPECT_EQ(t.dtype, DType::float64);
    const auto bytes = t.contiguous_bytes();
    double values[4];
    std::memcpy(values, bytes.data(), sizeof values);
    EXPECT_EQ(values[0], 1.2);
    EXPECT_EQ(values[3], -7.8);
    EXPECT_EQ(s.object.protocol, 0);
    ASSERT_EQ(s.storages.size(), 1u);
    EXPECT_EQ(s.storages[0].name, "storage/94264066933152");
    EXPECT_EQ(s.storages[0].size, 32u);
    EXPECT_EQ(s.storages[0].offset, 383u - 32u);
  }
  {
    const LegacyStream s = read_corpus("gopickle_t1.13_legacy_int16_proto4.pt");  // FRAME, MEMOIZE, STACK_GLOBAL
    const TensorData& t = s.root.as_tensor();
    EXPECT_EQ(t.dtype, DType::int16);
    std::int16_t values[4];
    std::memcpy(values, t.contiguous_bytes().data(), sizeof values);
    EXPECT_EQ(values[1], -2);
    EXPECT_EQ(values[3], -4);
    EXPECT_EQ(s.object.protocol, 4);
  }
  {
    const LegacyStream s = read_corpus("gopickle_t1.13_legacy_bfloat16_proto2.pt");
    EXPECT_EQ(s.root.as_tensor().dtype, DType::bfloat16);
    EXPECT_EQ(s.root.as_tensor().contiguous_bytes(),
              holdpoint::testing::bytes_of("\x9a\x3f\x5a\xc0\xb3\x40\xfa\xc0"));
  }
  {
    const LegacyStream s = read_corpus("mmcv_model_zoo_test_2020-05_legacy.pth");
    EXPECT_EQ(floats_of(s.root.as_tensor()), std::vector<float>{2.0f});
  }
}

TEST(LegacyReader, ReadsStateDictsWithMetadataAndViews) {
  const LegacyStream iris = read_corpus("serve_iris_2020-05_legacy.pt");
  ASSERT_TRUE(iris.root.is_ordered_dict());
  EXPECT_EQ(iris.root.as_dict().at("Linear.weight").as_tensor().sizes, (std::vector<std::int64_t>{3, 4}));
  ASSERT_TRUE(iris.root.as_dict().metadata());
  EXPECT_EQ(iris.root.as_dict().metadata()->as_dict().at("Linear").as_dict().at("version").as_int(), 1);

  // t[10:20] and t[50:60] of one 100-element storage, saved without clone().
  const LegacyStream views = read_corpus("burn_legacy_uncloned_views.pt");
  const TensorData& a = views.root.as_dict().at("tensor1").as_tensor();
  const TensorData& b = views.root.as_dict().at("tensor2").as_tensor();
  EXPECT_EQ(a.storage, b.storage);
  EXPECT_EQ(a.storage_offset, 10);
  EXPECT_EQ(b.storage_offset, 50);
  EXPECT_EQ(floats_of(a)[0], 10.0f);
  EXPECT_EQ(floats_of(b)[9], 59.0f);
  ASSERT_EQ(views.storages.size(), 1u);
  EXPECT_EQ(views.storages[0].size, 400u);

  // LSTM weights: four views of one cuda:0 storage of 97280 floats.
  const LegacyStream lstm = read_corpus("pyannote_sad_domain_0140_2020-01_legacy_lstm_views.pt");
  const Dict& lstm_dict = lstm.root.as_dict();
  EXPECT_EQ(lstm.object.tensor_count, 6u);
  EXPECT_EQ(lstm.storages.size(), 3u);
  EXPECT_EQ(lstm_dict.at("0.rnn_.weight_hh_l0").as_tensor().storage_offset, 30720);
  EXPECT_EQ(lstm_dict.at("0.rnn_.weight_hh_l0").as_tensor().sizes, (std::vector<std::int64_t>{512, 128}));
  EXPECT_EQ(lstm_dict.at("0.rnn_.bias_hh_l0").as_tensor().storage,
            lstm_dict.at("0.rnn_.weight_ih_l0").as_tensor().storage);
}

TEST(LegacyReader, ReadsEveryLegacyFileOfTheCorpus) {
  struct Expected {
    const char* file;
    ValueKind root;
    std::uint64_t tensors;
    std::size_t storages;
  };
  const Expected expected[] = {
      {"burn_legacy_uncloned_views.pt", ValueKind::dict, 2, 1},
      {"gopickle_t1.13_legacy_bfloat16_proto2.pt", ValueKind::tensor, 1, 1},
      {"gopickle_t1.13_legacy_int16_proto4.pt", ValueKind::tensor, 1, 1},
      {"gopickle_t1.5_legacy_float64_proto1.pt", ValueKind::tensor, 1, 1},
      {"innereye_epoch0_train_ckpt_2020-12_legacy.ckpt", ValueKind::dict, 156, 156},
      {"mmcv_model_2021-04_legacy.pth", ValueKind::ordered_dict, 6, 6},
      {"mmcv_model_zoo_test_2020-05_legacy.pth", ValueKind::tensor, 1, 1},
      {"picklescan_pytorch_model_legacy.bin", ValueKind::ordered_dict, 38, 38},
      {"pyannote_sad_ami_0121_optimizer_2020-01_legacy.pt", ValueKind::dict, 36, 36},
      {"pyannote_sad_domain_0140_2020-01_legacy_lstm_views.pt", ValueKind::ordered_dict, 6, 3},
      {"serve_iris_2020-05_legacy.pt", ValueKind::ordered_dict, 1, 1},
  };
  for (const Expected& e : expected) {
    SCOPED_TRACE(e.file);
    const auto bytes = read_file_bytes(corpus_dir() / "real_pt" / e.file);
    EXPECT_TRUE(looks_like_legacy_stream(bytes));
    const LegacyStream s = read_bytes(bytes);
    EXPECT_EQ(s.root.kind(), e.root);
    EXPECT_EQ(s.object.tensor_count, e.tensors);
    EXPECT_EQ(s.object.storage_count, e.storages);
    EXPECT_EQ(s.storages.size(), e.storages);
    EXPECT_EQ(s.protocol_version, 1001u);
    // Storage segments tile the end of the file exactly.
    std::uint64_t end = s.storages.empty() ? 0 : s.storages.back().offset + s.storages.back().size;
    EXPECT_EQ(end, bytes.size());
  }
}

TEST(LegacyReader, OptimizerCheckpointKeepsIntKeysAndFloats) {
  const LegacyStream s = read_corpus("pyannote_sad_ami_0121_optimizer_2020-01_legacy.pt");
  const Dict& root = s.root.as_dict();
  const Value& groups = root.at("param_groups");
  ASSERT_TRUE(groups.is_list());
  EXPECT_TRUE(groups.as_list()[0].as_dict().at("lr").is_double());
  const Dict& state = root.at("state").as_dict();
  ASSERT_FALSE(state.empty());
  EXPECT_TRUE(state.at_index(0).first.is_integer());
}

TEST(LegacyReader, ZipAndOtherFilesAreNotLegacyStreams) {
  for (const char* name : {"burn_bfloat16_2025-10.pt", "mmcv_model_2021-09_zip.pth"}) {
    SCOPED_TRACE(name);
    const auto bytes = read_file_bytes(corpus_dir() / "real_pt" / name);
    EXPECT_FALSE(looks_like_legacy_stream(bytes));
    EXPECT_ERROR_CODE(read_bytes(bytes), ErrorCode::legacy_magic_invalid);
  }
  const auto tar = read_file_bytes(corpus_dir() / "malicious" / "burn__tar_multi_dtype_incomplete_legacy_tar.tar");
  EXPECT_FALSE(looks_like_legacy_stream(tar));
  EXPECT_ERROR_CODE(read_bytes(tar), ErrorCode::legacy_magic_invalid);
  const auto bypass = read_file_bytes(corpus_dir() / "malicious" / "picklescan__data__pytorch_magic_bypass.pt");
  EXPECT_FALSE(looks_like_legacy_stream(bypass));  // the magic computed by __builtin__.eval
  EXPECT_ERROR_CODE(read_bytes(bypass), ErrorCode::legacy_magic_invalid);
  EXPECT_FALSE(looks_like_legacy_stream({}));
  EXPECT_ERROR_CODE(read_bytes({}), ErrorCode::legacy_magic_invalid);
}

// ==== files written by torch's legacy serializer (torch 2.13) ================================================================

// Writes legacy streams with Debian's torch and, beside each, the expected
// tensors: "name dtype dims... | hex bytes" per line, in C order.
const char* kGenerator = R"(
import collections, sys, torch
path, protocol = sys.argv[1], int(sys.argv[2])
w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
obj = {
  'w': w,
  'view': w[1:, ::2],
  'i64': torch.tensor([1, -2, 3**30], dtype=torch.int64),
  'i32': torch.tensor([[7, -8]], dtype=torch.int32),
  'u8': torch.tensor([0, 255], dtype=torch.uint8),
  'i8': torch.tensor([-128], dtype=torch.int8),
  'b': torch.tensor([True, False]),
  'h': torch.tensor([1.5, -2.25], dtype=torch.float16),
  'bf': torch.tensor([1.0, -2.0], dtype=torch.bfloat16),
  'c': torch.tensor([1 + 2j], dtype=torch.complex64),
  'cd': torch.tensor([3 - 4j], dtype=torch.complex128),
  'scalar': torch.tensor(3.5, dtype=torch.float64),
  'empty': torch.zeros(0, 3),
  'sd': collections.OrderedDict(a=torch.ones(2, requires_grad=False)),
  'param': torch.nn.Parameter(torch.full((2,), 0.25)),
  'step': 7, 'big': 2**40, 'name': 'h\u00e9', 'flag': True, 'none': None, 'list': [1, 2], 'tuple': (3, 4),
  'lr': 0.125,
}
torch.save(obj, path, pickle_protocol=protocol, _use_new_zipfile_serialization=False)
def flat(t):
  return t.detach().contiguous().reshape(-1).view(torch.uint8).tolist()
with open(path + '.expected', 'w') as f:
  for name in ['w', 'view', 'i64', 'i32', 'u8', 'i8', 'b', 'h', 'bf', 'c', 'cd', 'scalar', 'empty', 'param']:
    t = obj[name]
    f.write('%s %s %s | %s\n' % (name, str(t.dtype).replace('torch.', ''), ' '.join(map(str, t.shape)),
                                 bytes(flat(t)).hex()))
  f.write('sd.a %s %s | %s\n' % ('float32', '2', bytes(flat(obj['sd']['a'])).hex()))
)";

struct ExpectedTensor {
  std::string dtype;
  std::vector<std::int64_t> sizes;
  std::vector<std::byte> bytes;
};

std::map<std::string, ExpectedTensor> parse_expected(const std::filesystem::path& path) {
  std::map<std::string, ExpectedTensor> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string name, token;
    ExpectedTensor t;
    fields >> name >> t.dtype;
    while (fields >> token && token != "|") t.sizes.push_back(std::stoll(token));
    std::string hex;
    fields >> hex;
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
      t.bytes.push_back(std::byte(std::stoi(hex.substr(i, 2), nullptr, 16)));
    }
    out[name] = t;
  }
  return out;
}

TEST(LegacyReader, MatchesTensorsWrittenByTorchsLegacySerializer) {
  holdpoint::testing::TempDir dir;
  holdpoint::testing::write_file_bytes(dir / "generate.py", holdpoint::testing::bytes_of(kGenerator));
  for (int protocol : {1, 2, 4}) {
    SCOPED_TRACE(protocol);
    const auto path = dir / ("legacy" + std::to_string(protocol) + ".pt");
    const auto run = holdpoint::testing::run_python(holdpoint::testing::oracle_python(), dir / "generate.py",
                                                    path.string() + " " + std::to_string(protocol));
    ASSERT_EQ(run.status, 0) << run.output;
    const auto bytes = read_file_bytes(path);
    ASSERT_TRUE(looks_like_legacy_stream(bytes));
    const LegacyStream s = read_bytes(bytes);
    const Dict& root = s.root.as_dict();
    const auto expected = parse_expected(path.string() + ".expected");
    ASSERT_EQ(expected.size(), 15u);
    for (const auto& [name, want] : expected) {
      SCOPED_TRACE(name);
      const TensorData& t = name == "sd.a" ? root.at("sd").as_dict().at("a").as_tensor() : root.at(name).as_tensor();
      EXPECT_EQ(dtype_name(t.dtype), want.dtype);
      EXPECT_EQ(t.sizes, want.sizes);
      EXPECT_EQ(t.contiguous_bytes(), want.bytes);
    }
    EXPECT_EQ(root.at("view").as_tensor().storage, root.at("w").as_tensor().storage);
    EXPECT_TRUE(root.at("param").as_tensor().is_parameter);
    EXPECT_TRUE(root.at("param").as_tensor().requires_grad);
    EXPECT_TRUE(root.at("sd").is_ordered_dict());
    EXPECT_EQ(root.at("step").as_int(), 7);
    EXPECT_EQ(root.at("big").as_int(), std::int64_t{1} << 40);
    EXPECT_EQ(root.at("name").as_string(), "h\xc3\xa9");
    EXPECT_TRUE(root.at("flag").as_bool());
    EXPECT_TRUE(root.at("none").is_none());
    EXPECT_EQ(root.at("list").as_list().size(), 2u);
    EXPECT_TRUE(root.at("tuple").is_tuple());
    EXPECT_EQ(root.at("lr").as_double(), 0.125);
    EXPECT_EQ(s.object.protocol, protocol >= 2 ? protocol : 0);
    EXPECT_EQ(s.storages.size(), 14u);  // 15 tensors; 'view' shares the storage of 'w'
  }
}

// ==== rejections ===================================================================================

// A synthetic legacy stream with knobs for each part.
struct LegacyParts {
  std::string magic_payload = std::string("\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 10);
  std::int64_t protocol_version = 1001;
  bool little_endian = true;
  bool sys_info_is_dict = true;
  std::vector<std::string> declared = {"140"};  // one FloatStorage of 3 elements per key
  bool view_metadata = false;
  std::vector<std::string> key_list = {"140"};
  std::uint64_t header_numel = 3;
  std::size_t data_bytes = 12;
  std::string trailing;

  std::vector<std::byte> bytes() const {
    PickleBuilder p;
    p.proto().op(op::LONG1).u8(static_cast<std::uint8_t>(magic_payload.size())).raw(magic_payload).stop();
    p.proto().integer(protocol_version).stop();
    p.proto();
    if (sys_info_is_dict) {
      p.empty_dict().mark().str("protocol_version").integer(1001).str("little_endian").boolean(little_endian);
      p.str("type_sizes").empty_dict().mark().str("short").integer(2).str("int").integer(4).str("long").integer(4);
      p.setitems().setitems().stop();
    } else {
      p.empty_list().stop();
    }
    p.proto().mark();
    for (const std::string& key : declared) {
      p.global("torch._utils", "_rebuild_tensor_v2").mark();
      p.mark().str("storage").global("torch", "FloatStorage").str(key).str("cpu").integer(3);
      if (view_metadata) {
        p.str(key).integer(0).integer(3).tuple3();
      } else {
        p.none();
      }
      p.tuple().binpersid().integer(0).int_tuple({3}).int_tuple({1}).boolean(false).ordered_dict().tuple().reduce();
    }
    p.tuple().stop();
    p.proto().empty_list();
    if (!key_list.empty()) {
      p.mark();
      for (const std::string& key : key_list) p.str(key);
      p.appends();
    }
    p.stop();
    for (std::size_t i = 0; i < key_list.size(); ++i) {
      p.le(header_numel, 8);
      for (std::size_t b = 0; b < data_bytes; ++b) p.u8(static_cast<std::uint8_t>(b));
    }
    p.raw(trailing);
    return p.bytes();
  }
};

TEST(LegacyReader, SyntheticStreamParses) {
  LegacyParts parts;
  parts.declared = {"140", "141"};
  parts.key_list = {"141", "140"};  // segment order follows the key list, not the pickle
  const auto file = std::make_shared<std::vector<std::byte>>(parts.bytes());
  const LegacyStream s = read_legacy_stream(*file, file, {});
  ASSERT_EQ(s.storages.size(), 2u);
  EXPECT_EQ(s.storages[0].name, "storage/141");
  EXPECT_EQ(s.storages[1].name, "storage/140");
  EXPECT_EQ(s.storages[1].offset, file->size() - 12);
  EXPECT_EQ(s.storages[0].size, 12u);
  // Zero-copy views of the segments that keep the file alive.
  const TensorData& first = s.root.as_list()[0].as_tensor();
  EXPECT_EQ(first.storage->data(), file->data() + s.storages[1].offset);
  EXPECT_EQ(first.storage->owner(), file);
  EXPECT_EQ(s.root.as_list()[1].as_tensor().storage->data(), file->data() + s.storages[0].offset);
}

TEST(LegacyReader, RejectsBadMagic) {
  LegacyParts wrong_value;
  wrong_value.magic_payload[0] = '\x6d';
  EXPECT_ERROR_CODE(read_bytes(wrong_value.bytes()), ErrorCode::legacy_magic_invalid);
  LegacyParts short_value;
  short_value.magic_payload.resize(8);
  EXPECT_ERROR_CODE(read_bytes(short_value.bytes()), ErrorCode::legacy_magic_invalid);
  PickleBuilder text_without_l;
  text_without_l.op(op::LONG).raw("119547037146038801333356\n").stop();
  EXPECT_ERROR_CODE(read_bytes(text_without_l.bytes()), ErrorCode::legacy_magic_invalid);
  PickleBuilder bad_frame;  // a FRAME whose length does not end at the magic's STOP
  bad_frame.proto(4).op(op::FRAME).le(14, 8).op(op::LONG1).u8(10).raw(LegacyParts().magic_payload).stop().none();
  EXPECT_ERROR_CODE(read_bytes(bad_frame.bytes()), ErrorCode::legacy_magic_invalid);
  PickleBuilder bad_proto;
  bad_proto.proto(9).op(op::LONG1).u8(10).raw(LegacyParts().magic_payload).stop();
  EXPECT_ERROR_CODE(read_bytes(bad_proto.bytes()), ErrorCode::legacy_magic_invalid);
  PickleBuilder truncated;
  truncated.proto().op(op::LONG1).u8(10).raw("\x6c\xfc\x9c");
  EXPECT_FALSE(looks_like_legacy_stream(truncated.bytes()));
}

TEST(LegacyReader, RejectsOtherProtocolVersions) {
  LegacyParts old;
  old.protocol_version = 1000;
  EXPECT_ERROR_CODE(read_bytes(old.bytes()), ErrorCode::legacy_protocol_unsupported);
  PickleBuilder text_version;
  text_version.proto().op(op::LONG1).u8(10).raw(LegacyParts().magic_payload).stop().proto().str("1001").stop();
  EXPECT_ERROR_CODE(read_bytes(text_version.bytes()), ErrorCode::legacy_protocol_unsupported);
}

TEST(LegacyReader, RejectsBigEndianOrMalformedSysInfo) {
  LegacyParts big_endian;
  big_endian.little_endian = false;
  EXPECT_ERROR_CODE(read_bytes(big_endian.bytes()), ErrorCode::legacy_sys_info_invalid);
  LegacyParts not_dict;
  not_dict.sys_info_is_dict = false;
  EXPECT_ERROR_CODE(read_bytes(not_dict.bytes()), ErrorCode::legacy_sys_info_invalid);
}

TEST(LegacyReader, RejectsKeyListsThatDisagreeWithThePickle) {
  LegacyParts missing;
  missing.declared = {"140", "141"};
  missing.key_list = {"140"};
  EXPECT_ERROR_CODE(read_bytes(missing.bytes()), ErrorCode::legacy_storage_keys_invalid);
  LegacyParts extra;
  extra.key_list = {"140", "999"};
  EXPECT_ERROR_CODE(read_bytes(extra.bytes()), ErrorCode::legacy_storage_keys_invalid);
  LegacyParts other;
  other.key_list = {"999"};
  EXPECT_ERROR_CODE(read_bytes(other.bytes()), ErrorCode::legacy_storage_keys_invalid);
  LegacyParts duplicate;  // Python would read the segment twice
  duplicate.declared = {"140", "141"};
  duplicate.key_list = {"140", "140"};
  EXPECT_ERROR_CODE(read_bytes(duplicate.bytes()), ErrorCode::legacy_storage_keys_invalid);
  LegacyParts none;
  none.key_list = {};
  EXPECT_ERROR_CODE(read_bytes(none.bytes()), ErrorCode::legacy_storage_keys_invalid);
}

TEST(LegacyReader, RejectsSegmentHeaderMismatch) {
  LegacyParts more;
  more.header_numel = 4;
  EXPECT_ERROR_CODE(read_bytes(more.bytes()), ErrorCode::legacy_storage_header_invalid);
  LegacyParts fewer;
  fewer.header_numel = 2;
  fewer.data_bytes = 8;
  EXPECT_ERROR_CODE(read_bytes(fewer.bytes()), ErrorCode::legacy_storage_header_invalid);
  LegacyParts huge;
  huge.header_numel = ~std::uint64_t{0};
  EXPECT_ERROR_CODE(read_bytes(huge.bytes()), ErrorCode::legacy_storage_header_invalid);
}

TEST(LegacyReader, RejectsTruncatedStorageAndTrailingData) {
  LegacyParts parts;
  auto bytes = parts.bytes();
  bytes.pop_back();
  EXPECT_ERROR_CODE(read_bytes(bytes), ErrorCode::pickle_truncated);
  bytes.resize(bytes.size() - 11 - 4);  // inside the 8-byte header
  EXPECT_ERROR_CODE(read_bytes(bytes), ErrorCode::pickle_truncated);
  LegacyParts trailing;
  trailing.trailing = "x";
  EXPECT_ERROR_CODE(read_bytes(trailing.bytes()), ErrorCode::legacy_trailing_data);
  PickleBuilder p;  // 2^30 floats declared in a small file: refused in pass 1, before any segment
  p.proto().op(op::LONG1).u8(10).raw(LegacyParts().magic_payload).stop().proto().integer(1001).stop();
  p.proto().empty_dict().str("protocol_version").integer(1001).setitem().str("little_endian").boolean(true);
  p.setitem().stop().proto().global("torch._utils", "_rebuild_tensor_v2").mark().mark().str("storage");
  p.global("torch", "FloatStorage").str("7").str("cpu").integer(1 << 30).none().tuple().binpersid().integer(0);
  p.int_tuple({1}).int_tuple({1}).boolean(false).ordered_dict().tuple().reduce().stop();
  EXPECT_ERROR_CODE(read_bytes(p.bytes()), ErrorCode::pickle_truncated);
}

TEST(LegacyReader, RejectsStorageViewMetadata) {
  LegacyParts views;
  views.view_metadata = true;
  EXPECT_ERROR_CODE(read_bytes(views.bytes()), ErrorCode::legacy_view_metadata_unsupported);
}

TEST(LegacyReader, RejectsStoragesOutsideTheObjectPickle) {
  // The sys_info pickle must not name storages.
  PickleBuilder p;
  p.proto().op(op::LONG1).u8(10).raw(LegacyParts().magic_payload).stop().proto().integer(1001).stop();
  p.proto().mark().str("storage").global("torch", "FloatStorage").str("1").str("cpu").integer(1).none().tuple();
  p.binpersid().stop();
  EXPECT_ERROR_CODE(read_bytes(p.bytes()), ErrorCode::persistent_id_invalid);
}

TEST(LegacyReader, ErrorsNameThePartAndItsOffset) {
  LegacyParts parts;
  parts.declared = {"../etc"};
  parts.key_list = {"../etc"};
  try {
    read_bytes(parts.bytes());
    ADD_FAILURE() << "accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::storage_key_invalid);
    EXPECT_NE(error.detail().find("legacy stream, object pickle at file offset"), std::string::npos) << error.detail();
  }
}

// ==== the hostile corpus ============================================================================

TEST(LegacyReader, HostilePicklesAreRefusedQuicklyWithoutLargeAllocations) {
  Limits limits;  // defaults: the bounds must hold without tuning
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus_dir() / "malicious")) {
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    const auto bytes = read_file_bytes(entry.path());
    auto owner = std::make_shared<std::vector<std::byte>>(bytes);
    for (bool legacy : {false, true}) {
      g_largest_allocation = 0;
      g_allocated_bytes = 0;
      const auto start = std::chrono::steady_clock::now();
      bool refused = false;
      try {
        if (legacy) {
          read_legacy_stream(*owner, owner, limits);
        } else {
          holdpoint::testing::MemoryStorages storages;
          storages.fabricate_missing(1 << 20);
          read_pickle(*owner, storages, limits);
        }
      } catch (const Error&) {
        refused = true;
      }
      const auto elapsed = std::chrono::steady_clock::now() - start;
      // Two of picklescan's files are benign lists (benign0_v3/v4); the VM may take those.
      if (name.find("benign") == std::string::npos) {
        EXPECT_TRUE(refused) << (legacy ? "legacy" : "pickle");
      }
      EXPECT_LT(elapsed, std::chrono::seconds(1));
      EXPECT_LT(g_largest_allocation.load(), std::size_t{16} << 20);
      EXPECT_LT(g_allocated_bytes.load(), std::size_t{256} << 20);
    }
    ++count;
  }
  EXPECT_GE(count, 90);
}

}  // namespace
}  // namespace holdpoint::format
