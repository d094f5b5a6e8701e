// safetensors reader and writer: real files, round trips, interop with an
// independent Python reader, and one test per crafted attack.
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/json_string.h"
#include "format/safetensors/safetensors.h"
#include "format/safetensors/safetensors_json.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/base/byte_sink.h"
#include "support/test_support.h"

namespace holdpoint::format {
namespace {

using holdpoint::testing::bytes_of;
using holdpoint::testing::corpus_dir;
using holdpoint::testing::read_file_bytes;
using holdpoint::testing::TempDir;
using holdpoint::testing::write_file_bytes;

using Bytes = std::vector<std::byte>;

// ---- helpers ------------------------------------------------------------------------

Bytes le64(std::uint64_t value) {
  Bytes out(8);
  for (auto& byte : out) {
    byte = static_cast<std::byte>(value & 0xFF);
    value >>= 8;
  }
  return out;
}

// u64 LE length ‖ header ‖ data, with the length taken from the header
// unless `declared` overrides it.
Bytes make_file(std::string_view header, const Bytes& data = {}, std::optional<std::uint64_t> declared = {}) {
  Bytes file = le64(declared.value_or(header.size()));
  for (const char c : header) file.push_back(static_cast<std::byte>(c));
  file.insert(file.end(), data.begin(), data.end());
  return file;
}

Bytes zeros(std::size_t n) { return Bytes(n, std::byte{0}); }

// A one-tensor header for the common negative cases.
std::string one_tensor(std::string_view dtype, std::string_view shape, std::string_view offsets) {
  return std::string(R"({"t":{"dtype":")") + std::string(dtype) + R"(","shape":)" + std::string(shape) +
         R"(,"data_offsets":)" + std::string(offsets) + "}}";
}

// Reads `file`, keeping a private copy alive as the owner of the tensors.
SafetensorsFile read_bytes(const Bytes& file, const Limits& limits = {}) {
  auto owned = std::make_shared<const Bytes>(file);
  return read_safetensors(*owned, owned, limits);
}

Bytes write_bytes(const Value& root, const std::map<std::string, std::string>& metadata = {}) {
  io::MemorySink sink;
  write_safetensors(sink, root, metadata);
  return sink.take();
}

// The writer orders tensors by element size then name, so a round trip keeps
// the mapping, not the insertion order: compare name by name.
std::string tensor_mapping_difference(const Value& expected, const Value& actual) {
  const Dict& x = expected.as_dict();
  const Dict& y = actual.as_dict();
  if (x.size() != y.size()) return "sizes " + std::to_string(x.size()) + " vs " + std::to_string(y.size());
  for (const auto& [key, value] : x) {
    const Value* other = y.find(key);
    if (!other) return "missing " + key.to_string();
    const std::string difference = describe_difference(value, *other);
    if (!difference.empty()) return key.to_string() + ": " + difference;
  }
  return {};
}

Bytes random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 generator(seed);
  Bytes out(n);
  for (auto& byte : out) byte = static_cast<std::byte>(generator() & 0xFF);
  return out;
}

// Sized by bits, so that sub-byte dtypes work (given sizes whose bits fill whole bytes).
TensorData random_tensor(DType dtype, std::vector<std::int64_t> sizes, std::uint32_t seed) {
  std::int64_t numel = 1;
  for (auto size : sizes) numel *= size;
  return TensorData::from_bytes(dtype, std::move(sizes),
                                random_bytes(static_cast<std::size_t>(numel) * dtype_bits(dtype) / 8, seed));
}

// A strided view over a private storage of `storage_elements` random elements.
TensorData strided_view(DType dtype, std::vector<std::int64_t> sizes, std::vector<std::int64_t> strides,
                        std::int64_t offset, std::size_t storage_elements, std::uint32_t seed) {
  TensorData tensor;
  tensor.dtype = dtype;
  tensor.sizes = std::move(sizes);
  tensor.strides = std::move(strides);
  tensor.storage_offset = offset;
  tensor.storage = Storage::copy_of(random_bytes(storage_elements * dtype_itemsize(dtype), seed));
  return tensor;
}

Value dict_of(std::vector<std::pair<std::string, TensorData>> entries) {
  Dict dict;
  for (auto& [name, tensor] : entries) dict.insert(name, Value::tensor(std::move(tensor)));
  return Value::dict(std::move(dict));
}

void expect_round_trip(const Value& root, const std::map<std::string, std::string>& metadata = {}) {
  const Bytes file = write_bytes(root, metadata);
  const SafetensorsFile parsed = read_bytes(file);
  EXPECT_EQ(tensor_mapping_difference(root, parsed.root), "");
  EXPECT_EQ(parsed.metadata, metadata);
  EXPECT_EQ(parsed.header_bytes % 8, 0u);
}

std::string hex_of(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (const char c : text) {
    out.push_back(kHex[static_cast<unsigned char>(c) >> 4]);
    out.push_back(kHex[static_cast<unsigned char>(c) & 0xF]);
  }
  return out;
}

// Runs the oracle Python on `script` with `arguments`; returns its output and
// fails the test on a non-zero exit.
std::string run_python(const TempDir& dir, std::string_view script, const std::vector<std::string>& arguments) {
  const auto script_path = dir / "oracle.py";
  write_file_bytes(script_path, bytes_of(script));
  std::string quoted;
  for (const auto& argument : arguments) quoted += " '" + argument + "'";
  const auto run = holdpoint::testing::run_python(holdpoint::testing::oracle_python(), script_path, quoted);
  EXPECT_EQ(run.status, 0) << "python failed:\n" << run.output;
  return run.output;
}


// ---- the independent Python oracles -------------------------------------------------

// Decodes only the header, with the standard library: one line per tensor in
// header order ("T <hex name> <dtype> <dims or -> <begin> <end>"), one per
// metadata entry ("M <hex key> <hex value>"), then "N <header length>".
constexpr std::string_view kDecodeHeaderScript = R"PY(
import json, struct, sys
data = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', data[:8])[0]
header = json.loads(data[8:8 + n].decode('utf-8'), object_pairs_hook=lambda pairs: pairs)
for key, value in header:
    if key == '__metadata__':
        for mk, mv in value or []:
            print('M', mk.encode().hex(), mv.encode().hex())
        continue
    info = dict(value)
    dims = ','.join(str(d) for d in info['shape']) or '-'
    print('T', key.encode().hex(), info['dtype'], dims, info['data_offsets'][0], info['data_offsets'][1])
print('N', n)
)PY";

// Checks the layout rules of the reference writer on a file we wrote, then
// prints "T <hex name> <sha256 of its bytes>" per tensor in file order.
constexpr std::string_view kCheckLayoutScript = R"PY(
import hashlib, json, struct, sys
BITS = {'F4': 4, 'F6_E2M3': 6, 'F6_E3M2': 6,
        'BOOL': 8, 'U8': 8, 'I8': 8, 'F8_E5M2': 8, 'F8_E4M3': 8, 'F8_E8M0': 8, 'F8_E4M3FNUZ': 8, 'F8_E5M2FNUZ': 8,
        'I16': 16, 'U16': 16, 'F16': 16, 'BF16': 16, 'I32': 32, 'U32': 32, 'F32': 32,
        'C64': 64, 'F64': 64, 'I64': 64, 'U64': 64}
data = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', data[:8])[0]
assert n % 8 == 0, 'header length %d is not a multiple of 8' % n
raw = data[8:8 + n]
stripped = raw.rstrip(b' ')
assert stripped.endswith(b'}') and len(raw) - len(stripped) < 8, 'padding is not 0-7 spaces'
pairs = json.loads(raw.decode('utf-8'), object_pairs_hook=lambda p: p)
keys = [k for k, _ in pairs]
assert len(keys) == len(set(keys)), 'duplicate keys'
if '__metadata__' in keys:
    assert keys[0] == '__metadata__', '__metadata__ is not first'
    for mk, mv in pairs[0][1]:
        assert isinstance(mv, str)
        print('M', mk.encode().hex(), mv.encode().hex())
tensors = [(k, dict(v)) for k, v in pairs if k != '__metadata__']
for name, _ in tensors:
    print('H', name.encode().hex())
# The data buffer (tensors by offset) is ordered by alignment, then name.
tensors.sort(key=lambda kv: tuple(kv[1]['data_offsets']))
expected_order = sorted(tensors, key=lambda kv: (-BITS[kv[1]['dtype']], kv[0].encode()))
assert [k for k, _ in tensors] == [k for k, _ in expected_order], 'data is not ordered by alignment, then name'
offset = 0
for name, info in tensors:
    assert set(info) == {'dtype', 'shape', 'data_offsets'}
    begin, end = info['data_offsets']
    assert begin == offset, 'gap or overlap before %r' % name
    numel = 1
    for d in info['shape']:
        numel *= d
    assert numel * BITS[info['dtype']] % 8 == 0, 'bits of %r' % name
    assert end - begin == numel * BITS[info['dtype']] // 8, 'size of %r' % name
    offset = end
    print('T', name.encode().hex(), hashlib.sha256(data[8 + n + begin:8 + n + end]).hexdigest())
assert 8 + n + offset == len(data), 'data does not end at the end of the file'
print('OK')
)PY";

// ---- real files ---------------------------------------------------------------------

constexpr std::string_view kLfsPointer = "inkwash_git_lfs_pointer_learned_embeds.safetensors";

TEST(SafetensorsCorpus, EveryRealFileMatchesAnIndependentHeaderDecode) {
  TempDir dir;
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus_dir() / "safetensors")) {
    if (entry.path().filename() == kLfsPointer) continue;
    SCOPED_TRACE(entry.path().filename().string());
    ++files;
    const Bytes file = read_file_bytes(entry.path());
    const SafetensorsFile parsed = read_bytes(file);
    std::istringstream lines(run_python(dir, kDecodeHeaderScript, {entry.path().string()}));

    std::map<std::string, std::string> metadata;
    std::size_t index = 0;
    std::string tag;
    while (lines >> tag) {
      if (tag == "M") {
        std::string key, value;
        lines >> key >> value;
        metadata[key] = value;
      } else if (tag == "T") {
        std::string name, dtype, dims;
        std::uint64_t begin = 0, end = 0;
        lines >> name >> dtype >> dims >> begin >> end;
        ASSERT_LT(index, parsed.root.as_dict().size());
        const auto& [key, value] = parsed.root.as_dict().at_index(index);
        EXPECT_EQ(hex_of(key.as_string()), name) << "header order is kept";
        const TensorData& tensor = value.as_tensor();
        EXPECT_EQ(dtype_safetensors_name(tensor.dtype).value_or("?"), dtype);
        std::string our_dims;
        for (std::size_t d = 0; d < tensor.sizes.size(); ++d) {
          our_dims += (d ? "," : "") + std::to_string(tensor.sizes[d]);
        }
        EXPECT_EQ(our_dims.empty() ? "-" : our_dims, dims);
        EXPECT_TRUE(tensor.is_contiguous());
        const RecordInfo& record = parsed.tensors.at(index);
        EXPECT_EQ(record.name, key.as_string());
        EXPECT_EQ(record.offset, 8 + parsed.header_bytes + begin);
        EXPECT_EQ(record.size, end - begin);
        // Zero-copy: the storage is the file's own bytes.
        EXPECT_EQ(tensor.storage->nbytes(), end - begin);
        EXPECT_EQ(std::memcmp(tensor.storage->data(), file.data() + record.offset, end - begin), 0);
        ++index;
      } else if (tag == "N") {
        std::uint64_t n = 0;
        lines >> n;
        EXPECT_EQ(parsed.header_bytes, n);
      } else {
        FAIL() << "unexpected oracle output " << tag;
      }
    }
    EXPECT_EQ(index, parsed.root.as_dict().size());
    std::map<std::string, std::string> our_metadata;
    for (const auto& [key, value] : parsed.metadata) our_metadata[hex_of(key)] = hex_of(value);
    EXPECT_EQ(our_metadata, metadata);
  }
  EXPECT_EQ(files, 5u);
}

TEST(SafetensorsCorpus, TensorsAreViewsIntoTheOwnersBuffer) {
  auto file = std::make_shared<const Bytes>(read_file_bytes(corpus_dir() / "safetensors" / "burn_multi_layer.safetensors"));
  const SafetensorsFile parsed = read_safetensors(*file, file, {});
  ASSERT_EQ(parsed.root.as_dict().size(), 9u);
  EXPECT_TRUE(parsed.root.is_ordered_dict());
  for (const auto& [key, value] : parsed.root.as_dict()) {
    const Storage& storage = *value.as_tensor().storage;
    EXPECT_GE(storage.data(), file->data());
    EXPECT_LE(storage.data() + storage.nbytes(), file->data() + file->size());
    EXPECT_EQ(storage.owner(), std::static_pointer_cast<const void>(file));
  }
}

TEST(SafetensorsCorpus, GitLfsPointerIsRejectedByItsHeaderLength) {
  // "version " read as a little-endian u64 is ~2.3e18: far over the header bound.
  const Bytes file = read_file_bytes(corpus_dir() / "safetensors" / std::string(kLfsPointer));
  EXPECT_FALSE(looks_like_safetensors(file));
  EXPECT_ERROR_CODE(read_bytes(file), ErrorCode::safetensors_header_too_large);
}

TEST(SafetensorsCorpus, RealFilesSurviveAWriteReadRoundTrip) {
  for (const auto& entry : std::filesystem::directory_iterator(corpus_dir() / "safetensors")) {
    if (entry.path().filename() == kLfsPointer) continue;
    SCOPED_TRACE(entry.path().filename().string());
    const Bytes file = read_file_bytes(entry.path());
    const SafetensorsFile parsed = read_bytes(file);
    EXPECT_TRUE(looks_like_safetensors(file));
    const SafetensorsFile again = read_bytes(write_bytes(parsed.root, parsed.metadata));
    EXPECT_EQ(tensor_mapping_difference(parsed.root, again.root), "");
    EXPECT_EQ(again.metadata, parsed.metadata);
  }
}

// ---- round trips ----------------------------------------------------------------------

TEST(SafetensorsRoundTrip, EveryDtypeWithASafetensorsName) {
  std::size_t named = 0;
  for (std::size_t i = 0; i < kDTypeCount; ++i) {
    const auto dtype = static_cast<DType>(i);
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    if (!dtype_safetensors_name(dtype)) continue;
    ++named;
    // 3 x 8 elements fill whole bytes in every dtype, 4- and 6-bit ones included.
    expect_round_trip(dict_of({{"x", random_tensor(dtype, {3, 8}, static_cast<std::uint32_t>(i))}}));
    EXPECT_EQ(dtype_from_safetensors_name(*dtype_safetensors_name(dtype)), dtype);
  }
  // Every dtype name of the specification (docs/format.md §8).
  EXPECT_EQ(named, 22u);
}

TEST(SafetensorsRoundTrip, SubByteTensorsKeepTheirPackedBytes) {
  const Bytes packed = bytes_of(std::string_view("\x21\x43\x65", 3));
  const Value root = dict_of({{"f4", TensorData::from_bytes(DType::float4_e2m1fn, {3, 2}, packed)},
                              {"f6", TensorData::from_bytes(DType::float6_e2m3fn, {4}, packed)},
                              {"f6_empty", TensorData::from_bytes(DType::float6_e3m2fn, {0, 3}, {})},
                              {"byte", TensorData::from_bytes(DType::uint8, {1}, bytes_of("z"))}});
  const Bytes file = write_bytes(root);
  const SafetensorsFile parsed = read_bytes(file);
  EXPECT_EQ(tensor_mapping_difference(root, parsed.root), "");
  const TensorData& f4 = parsed.root.as_dict().at("f4").as_tensor();
  EXPECT_EQ(f4.dtype, DType::float4_e2m1fn);
  EXPECT_EQ(f4.sizes, (std::vector<std::int64_t>{3, 2}));
  EXPECT_EQ(f4.logical_bytes(), 3u);
  EXPECT_EQ(f4.contiguous_bytes(), packed);
  // Data by descending bits: "byte" (8), then the 6-bit ones by name, "f4" last.
  const std::uint64_t data_start = 8 + parsed.header_bytes;
  EXPECT_EQ(parsed.tensors[3].offset, data_start);
  EXPECT_EQ(parsed.tensors[1].offset, data_start + 1);
  EXPECT_EQ(parsed.tensors[0].offset, data_start + 4);
}

TEST(SafetensorsRoundTrip, ZeroDimensionalAndEmptyTensors) {
  expect_round_trip(dict_of({
      {"scalar", random_tensor(DType::float64, {}, 1)},
      {"empty", random_tensor(DType::float32, {0}, 2)},
      {"empty_middle", random_tensor(DType::int16, {2, 0, 3}, 3)},
      {"one", random_tensor(DType::uint8, {1}, 4)},
  }));
  expect_round_trip(Value::dict());
  expect_round_trip(Value::ordered_dict(), {{"only", "metadata"}});
}

TEST(SafetensorsRoundTrip, NonContiguousViewsAreWrittenInCOrder) {
  // Each view's expected bytes come from TensorData::contiguous_bytes.
  expect_round_trip(dict_of({
      {"transposed", strided_view(DType::float32, {4, 3}, {1, 4}, 0, 12, 1)},
      {"every_other", strided_view(DType::int64, {5}, {2}, 1, 11, 2)},
      {"broadcast", strided_view(DType::float16, {3, 4}, {0, 1}, 2, 6, 3)},
      {"sliced_3d", strided_view(DType::int8, {2, 3, 2}, {12, 4, 1}, 1, 24, 4)},
  }));
}

TEST(SafetensorsRoundTrip, NonContiguousViewsLargerThanTheScratchBufferAreChunked) {
  // Over 1 MiB each, so the writer must cut them: at the outer dimension, in the
  // middle of a 3-d view, and inside a single strided dimension.
  expect_round_trip(dict_of({
      {"transposed", strided_view(DType::float32, {700, 500}, {1, 700}, 0, 350000, 5)},
      {"middle_split", strided_view(DType::int16, {3, 900, 300}, {300, 900, 1}, 0, 810000, 6)},
      {"strided_1d", strided_view(DType::float64, {200000}, {2}, 1, 400001, 7)},
  }));
}

TEST(SafetensorsRoundTrip, ContiguousTensorsAreHandedToTheSinkWithoutCopy) {
  struct RecordingSink final : io::ByteSink {
    void write(std::span<const std::byte> bytes) override { position_ += bytes.size(); }
    void write_stable(std::span<const std::byte> bytes) override {
      stable.push_back(bytes.data());
      position_ += bytes.size();
    }
    std::uint64_t position() const override { return position_; }
    std::vector<const std::byte*> stable;
    std::uint64_t position_ = 0;
  };
  TensorData a = random_tensor(DType::float32, {8}, 1);
  TensorData b = random_tensor(DType::float32, {2, 2}, 2);
  const std::byte* a_data = a.storage->data();
  const std::byte* b_data = b.storage->data();
  RecordingSink sink;
  write_safetensors(sink, dict_of({{"a", std::move(a)}, {"b", std::move(b)}}));
  EXPECT_EQ(sink.stable, (std::vector<const std::byte*>{a_data, b_data}));
}

TEST(SafetensorsRoundTrip, UnicodeAndEscapedNames) {
  expect_round_trip(dict_of({
      {"caf\xC3\xA9", random_tensor(DType::float32, {2}, 1)},
      {"\xF0\x9F\x98\x80 emoji", random_tensor(DType::float32, {2}, 2)},
      {"quote\" backslash\\ slash/", random_tensor(DType::float32, {2}, 3)},
      {"control\x01\n\t\x1f\x7f", random_tensor(DType::float32, {2}, 4)},
      {std::string("nul\0inside", 10), random_tensor(DType::float32, {2}, 5)},
  }), {{"k\xC3\xA9y\"", "v\\al\nue"}});
}

TEST(SafetensorsRoundTrip, MetadataIsWrittenFirstAndReadBack) {
  const Bytes file = write_bytes(dict_of({{"w", random_tensor(DType::bfloat16, {2}, 1)}}),
                                 {{"format", "pt"}, {"note", ""}});
  const std::string header(reinterpret_cast<const char*>(file.data()) + 8, 40);
  EXPECT_EQ(header.substr(0, 18), R"({"__metadata__":{")");
  const SafetensorsFile parsed = read_bytes(file);
  EXPECT_EQ(parsed.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"note", ""}}));
}

TEST(SafetensorsRoundTrip, TenThousandTensors) {
  Dict dict;
  for (int i = 0; i < 10000; ++i) {
    const auto dtype = i % 3 == 0 ? DType::float32 : i % 3 == 1 ? DType::int8 : DType::float64;
    dict.insert("layer." + std::to_string(i), Value::tensor(random_tensor(dtype, {i % 4}, static_cast<std::uint32_t>(i))));
  }
  expect_round_trip(Value::ordered_dict(std::move(dict)));
}

TEST(SafetensorsWriter, HeaderKeepsTheMappingOrderAndDataIsAligned) {
  // Header in the mapping's order; data by descending element size then name,
  // offsets from 0; padding to 8 with spaces.
  const Bytes file = write_bytes(
      dict_of({{"b", TensorData::from_bytes(DType::int8, {1}, bytes_of("x"))},
               {"a", TensorData::from_bytes(DType::int8, {2}, bytes_of("yz"))},
               {"w", TensorData::from_bytes(DType::float32, {}, bytes_of("1234"))}}),
      {{"format", "pt"}});
  const std::string expected_header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I8","shape":[1],"data_offsets":[6,7]},)"
      R"("a":{"dtype":"I8","shape":[2],"data_offsets":[4,6]},"w":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})";
  std::string padded = expected_header;
  padded.append((8 - padded.size() % 8) % 8, ' ');
  Bytes expected = make_file(padded, bytes_of("1234yzx"));
  EXPECT_EQ(file, expected);
}

TEST(SafetensorsWriter, OurFilesPassAnIndependentPythonReader) {
  TempDir dir;
  std::vector<std::pair<std::string, TensorData>> entries;
  for (std::size_t i = 0; i < kDTypeCount; ++i) {
    const auto dtype = static_cast<DType>(i);
    if (!dtype_safetensors_name(dtype)) continue;
    entries.emplace_back("t_" + std::string(dtype_name(dtype)), random_tensor(dtype, {2, 4}, static_cast<std::uint32_t>(i)));
  }
  entries.emplace_back("scalar", random_tensor(DType::float64, {}, 90));
  entries.emplace_back("empty", random_tensor(DType::float32, {0, 4}, 91));
  entries.emplace_back("transposed", strided_view(DType::float32, {5, 3}, {1, 5}, 0, 15, 92));
  entries.emplace_back("caf\xC3\xA9 \"q\"", random_tensor(DType::int16, {3}, 93));
  std::map<std::string, std::string> expected_hashes;
  std::vector<std::string> written_order;
  for (const auto& [name, tensor] : entries) {
    expected_hashes[hex_of(name)] = Sha256::of(tensor.contiguous_bytes()).hex();
    written_order.push_back(hex_of(name));
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"\xC3\xA9", "line\nbreak"}};

  const auto path = dir / "ours.safetensors";
  write_file_bytes(path, write_bytes(dict_of(std::move(entries)), metadata));
  std::istringstream lines(run_python(dir, kCheckLayoutScript, {path.string()}));
  std::map<std::string, std::string> hashes, python_metadata;
  std::vector<std::string> header_order;
  std::string tag, ok;
  while (lines >> tag) {
    if (tag == "OK") {
      ok = tag;
    } else if (tag == "H") {
      std::string name;
      lines >> name;
      header_order.push_back(name);
    } else if (tag == "T") {
      std::string name, hash;
      lines >> name >> hash;
      hashes[name] = hash;
    } else if (tag == "M") {
      std::string key, value;
      lines >> key >> value;
      python_metadata[key] = value;
    } else {
      FAIL() << "unexpected oracle output " << tag;
    }
  }
  EXPECT_EQ(ok, "OK");
  EXPECT_EQ(hashes, expected_hashes);
  EXPECT_EQ(header_order, written_order) << "the header keeps the mapping's order";
  std::map<std::string, std::string> hex_metadata;
  for (const auto& [key, value] : metadata) hex_metadata[hex_of(key)] = hex_of(value);
  EXPECT_EQ(python_metadata, hex_metadata);
}

// ---- what the reader accepts --------------------------------------------------------------

TEST(SafetensorsReader, KeepsHeaderOrderAndReportsAbsoluteOffsets) {
  const std::string header =
      R"({"z":{"dtype":"U8","shape":[2],"data_offsets":[1,3]},"a":{"dtype":"I8","shape":[],"data_offsets":[0,1]}})";
  const SafetensorsFile parsed = read_bytes(make_file(header, bytes_of("abc")));
  ASSERT_EQ(parsed.root.as_dict().size(), 2u);
  EXPECT_EQ(parsed.root.as_dict().at_index(0).first.as_string(), "z");
  EXPECT_EQ(parsed.root.as_dict().at_index(1).first.as_string(), "a");
  EXPECT_EQ(parsed.tensors[0].offset, 8 + header.size() + 1);
  EXPECT_EQ(parsed.tensors[0].size, 2u);
  EXPECT_EQ(parsed.tensors[1].offset, 8 + header.size());
  EXPECT_EQ(parsed.root.as_dict().at("z").as_tensor().contiguous_bytes(), bytes_of("bc"));
}

TEST(SafetensorsReader, AcceptsPaddingWhitespaceAndAnEmptyHeader) {
  EXPECT_EQ(read_bytes(make_file("{}")).root.as_dict().size(), 0u);
  EXPECT_EQ(read_bytes(make_file("{}      ")).root.as_dict().size(), 0u);
  const std::string spaced = "{ \"t\" :\n{ \"dtype\" : \"U8\" ,\t\"shape\" : [ 1 ] , \"data_offsets\" : [ 0 , 1 ] } }\r\n ";
  EXPECT_EQ(read_bytes(make_file(spaced, zeros(1))).root.as_dict().size(), 1u);
}

TEST(SafetensorsReader, EmptyTensorsMayShareAnOffsetWithTheirNeighbour) {
  // Sorted by (begin, end), as the reference does: [0,0] [0,0] [0,2] [2,2].
  const std::string header = R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("e1":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                             R"("e2":{"dtype":"F32","shape":[3,0],"data_offsets":[0,0]},)"
                             R"("e3":{"dtype":"I64","shape":[0],"data_offsets":[2,2]}})";
  EXPECT_EQ(read_bytes(make_file(header, zeros(2))).root.as_dict().size(), 4u);
}

TEST(SafetensorsReader, NullMetadataMeansNoMetadataAsInTheReference) {
  // mlx writes "__metadata__":null (tests/corpus/safetensors/mlx_examples_*).
  const SafetensorsFile parsed = read_bytes(make_file(R"({"__metadata__":null})"));
  EXPECT_TRUE(parsed.metadata.empty());
}

TEST(SafetensorsReader, DecodesEscapesAndSurrogatePairs) {
  const std::string header = one_tensor("U8", "[1]", "[0,1]");
  const std::string escaped = R"({"caf\u00e9 \ud83d\ude00 \"\\\/\b\f\n\r\t":)" + header.substr(5);
  const SafetensorsFile parsed = read_bytes(make_file(escaped, zeros(1)));
  EXPECT_EQ(parsed.root.as_dict().at_index(0).first.as_string(), "caf\xC3\xA9 \xF0\x9F\x98\x80 \"\\/\b\f\n\r\t");
}

TEST(SafetensorsReader, LooksLikeSafetensorsOnlyForAPlausiblePrefix) {
  EXPECT_TRUE(looks_like_safetensors(make_file("{}")));
  // Damaged files that still start like safetensors are routed to the reader,
  // which names the damage precisely.
  EXPECT_TRUE(looks_like_safetensors(make_file("{")));
  EXPECT_ERROR_CODE(read_bytes(make_file("{")), ErrorCode::safetensors_header_invalid);
  EXPECT_TRUE(looks_like_safetensors(make_file("{}", {}, 100)));
  EXPECT_ERROR_CODE(read_bytes(make_file("{}", {}, 100)), ErrorCode::safetensors_header_length_invalid);
  // JSON whitespace before the brace, as the reference accepts it.
  EXPECT_TRUE(looks_like_safetensors(make_file(" {}")));
  EXPECT_TRUE(looks_like_safetensors(make_file("\r\n\t {}")));
  EXPECT_FALSE(looks_like_safetensors(bytes_of("12345678")));                 // no header at all
  EXPECT_FALSE(looks_like_safetensors(bytes_of("PK\x03\x04 not safetensors")));
}

TEST(SafetensorsReader, LeadingBlanksDoNotMakeTextLookLikeSafetensors) {
  // Other characters before the brace: the reference refuses them as JSON.
  for (const std::string_view prefix : {std::string_view("\f"), std::string_view("\v"), std::string_view("\xC2\xA0"),
                                       std::string_view("\0", 1), std::string_view("\xEF\xBB\xBF"), std::string_view("x")}) {
    const std::string header = std::string(prefix) + "{}";
    SCOPED_TRACE(hex_of(header));
    EXPECT_FALSE(looks_like_safetensors(make_file(header)));
    EXPECT_ERROR_CODE(read_bytes(make_file(header)), ErrorCode::safetensors_header_invalid);
  }
  // Whitespace counts only inside a header length that fits the file: eight
  // blanks as the "length" are 2.3e15 bytes.
  EXPECT_FALSE(looks_like_safetensors(bytes_of("        \n {}")));
  EXPECT_FALSE(looks_like_safetensors(bytes_of("This is text      {not json}")));
  EXPECT_FALSE(looks_like_safetensors(make_file("  {}", {}, 2)));            // the brace lies past the length
  EXPECT_FALSE(looks_like_safetensors(make_file("    ")));                   // blanks only
  EXPECT_FALSE(looks_like_safetensors(make_file("")));
}

// ---- attacks the reader stops -----------------------------------------------------------------

TEST(SafetensorsAttack, FileShorterThanTheLengthField) {
  EXPECT_ERROR_CODE(read_bytes(Bytes{}), ErrorCode::safetensors_header_too_small);
  EXPECT_ERROR_CODE(read_bytes(zeros(7)), ErrorCode::safetensors_header_too_small);
}

TEST(SafetensorsAttack, HugeHeaderLengthIsRefusedBeforeAllocating) {
  EXPECT_ERROR_CODE(read_bytes(make_file("{}", {}, 100'000'001)), ErrorCode::safetensors_header_too_large);
  EXPECT_ERROR_CODE(read_bytes(make_file("{}", {}, ~std::uint64_t{0})), ErrorCode::safetensors_header_too_large);
}

TEST(SafetensorsAttack, HeaderLengthBeyondTheFile) {
  EXPECT_ERROR_CODE(read_bytes(make_file("{}", {}, 3)), ErrorCode::safetensors_header_length_invalid);
}

TEST(SafetensorsAttack, HeaderLengthTwoToThe64MinusOneDoesNotWrap) {
  Limits limits;
  limits.max_safetensors_header_bytes = ~std::uint64_t{0};
  EXPECT_ERROR_CODE(read_bytes(make_file("{}", {}, ~std::uint64_t{0}), limits),
                    ErrorCode::safetensors_header_length_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file("{}", {}, ~std::uint64_t{0} - 7), limits),
                    ErrorCode::safetensors_header_length_invalid);
}

TEST(SafetensorsAttack, EmptyHeader) {
  EXPECT_ERROR_CODE(read_bytes(make_file("")), ErrorCode::safetensors_header_invalid);
}

TEST(SafetensorsAttack, NonUtf8InAName) {
  for (std::string bad : {"\xFF", "\xC0\xAF" /* overlong '/' */, "\xED\xA0\x80" /* encoded surrogate */,
                          "\xF4\x90\x80\x80" /* above U+10FFFF */, "\xE2\x82" /* truncated */}) {
    SCOPED_TRACE(hex_of(bad));
    EXPECT_ERROR_CODE(read_bytes(make_file("{\"" + bad + "\":" + one_tensor("U8", "[1]", "[0,1]").substr(5), zeros(1))),
                      ErrorCode::safetensors_header_invalid);
  }
}

TEST(SafetensorsAttack, HeaderThatIsNotJson) {
  EXPECT_ERROR_CODE(read_bytes(make_file("{not json}")), ErrorCode::safetensors_header_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"t":)")), ErrorCode::safetensors_header_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"a":"b",})")), ErrorCode::safetensors_header_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"a":1.})")), ErrorCode::safetensors_header_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"a":tru})")), ErrorCode::safetensors_header_invalid);
}

TEST(SafetensorsAttack, SchemaErrorDoesNotHideThatTheRestIsNotJson) {
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"t":1, garbage)")), ErrorCode::safetensors_header_invalid);
}

TEST(SafetensorsReader, LeadingWhitespaceWasRefusedAsUnknownFormat) {
  // Regression: the reference (serde_json) allows JSON whitespace before the
  // header object; holdpoint refused such files.
  EXPECT_EQ(read_bytes(make_file(" {}")).root.as_dict().size(), 0u);
  const std::string header = "\n\t\r " + one_tensor("U8", "[2]", "[0,2]") + " \n";
  const SafetensorsFile parsed = read_bytes(make_file(header, bytes_of("ab")));
  EXPECT_EQ(parsed.root.as_dict().at("t").as_tensor().contiguous_bytes(), bytes_of("ab"));
  EXPECT_EQ(parsed.tensors[0].offset, 8 + header.size());
}

TEST(SafetensorsAttack, WhitespaceAloneIsNotAHeader) {
  EXPECT_ERROR_CODE(read_bytes(make_file("   ")), ErrorCode::safetensors_header_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(" \n ")), ErrorCode::safetensors_header_invalid);
}

TEST(SafetensorsAttack, TopLevelArray) {
  // Valid JSON, as the reference parses it, but not the object the schema requires.
  EXPECT_ERROR_CODE(read_bytes(make_file("[]")), ErrorCode::safetensors_header_schema_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(" 7 ")), ErrorCode::safetensors_header_schema_invalid);
}

TEST(SafetensorsAttack, BytesAfterTheTopLevelObjectInsideTheHeader) {
  EXPECT_ERROR_CODE(read_bytes(make_file("{}{}")), ErrorCode::safetensors_header_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(std::string("{}\0\0\0\0\0\0", 8))), ErrorCode::safetensors_header_invalid);
}

TEST(SafetensorsAttack, DuplicateTensorNameLastOneWinsElsewhere) {
  const std::string header = R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  EXPECT_ERROR_CODE(read_bytes(make_file(header, zeros(2))), ErrorCode::safetensors_duplicate_key);
}

TEST(SafetensorsAttack, DuplicateNameHiddenByAnEscape) {
  const std::string header = R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("\u0074":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  EXPECT_ERROR_CODE(read_bytes(make_file(header, zeros(2))), ErrorCode::safetensors_duplicate_key);
}

TEST(SafetensorsAttack, DuplicateKeyInsideATensorObject) {
  const std::string header = R"({"t":{"dtype":"U8","shape":[1],"shape":[2],"data_offsets":[0,1]}})";
  EXPECT_ERROR_CODE(read_bytes(make_file(header, zeros(1))), ErrorCode::safetensors_duplicate_key);
}

TEST(SafetensorsAttack, DuplicateMetadataKeyOrSection) {
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"__metadata__":{"a":"1","a":"2"}})")),
                    ErrorCode::safetensors_duplicate_key);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"__metadata__":{"a":"1"},"__metadata__":{"b":"2"}})")),
                    ErrorCode::safetensors_duplicate_key);
}

TEST(SafetensorsAttack, DeepNestingInMetadataIsBoundedNotRecursed) {
  const std::string deep = R"({"__metadata__":)" + std::string(10000, '[') + std::string(10000, ']') + "}";
  EXPECT_ERROR_CODE(read_bytes(make_file(deep)), ErrorCode::safetensors_json_depth_limit);
  const std::string deep_objects = R"({"__metadata__":)" + [] {
    std::string s;
    for (int i = 0; i < 5000; ++i) s += R"({"a":)";
    return s;
  }();
  EXPECT_ERROR_CODE(read_bytes(make_file(deep_objects)), ErrorCode::safetensors_json_depth_limit);
}

TEST(SafetensorsAttack, DepthLimitAppliesToOrdinaryTensors) {
  const Bytes file = make_file(one_tensor("U8", "[1]", "[0,1]"), zeros(1));
  Limits limits;
  limits.max_json_depth = 3;
  EXPECT_EQ(read_bytes(file, limits).root.as_dict().size(), 1u);
  limits.max_json_depth = 2;
  EXPECT_ERROR_CODE(read_bytes(file, limits), ErrorCode::safetensors_json_depth_limit);
}

TEST(SafetensorsAttack, NonStringMetadataValue) {
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"__metadata__":{"a":1}})")), ErrorCode::safetensors_metadata_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"__metadata__":{"a":{"b":"c"}}})")),
                    ErrorCode::safetensors_metadata_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"__metadata__":{"a":null}})")), ErrorCode::safetensors_metadata_invalid);
}

TEST(SafetensorsAttack, MetadataThatIsNotAnObject) {
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"__metadata__":["a"]})")), ErrorCode::safetensors_metadata_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"__metadata__":"a"})")), ErrorCode::safetensors_metadata_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"__metadata__":true})")), ErrorCode::safetensors_metadata_invalid);
}

TEST(SafetensorsAttack, MetadataStringOverTheStringBound) {
  Limits limits;
  limits.max_string_bytes = 4;
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"__metadata__":{"a":"12345"}})"), limits),
                    ErrorCode::safetensors_metadata_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"__metadata__":{"12345":"a"}})"), limits),
                    ErrorCode::safetensors_metadata_invalid);
}

TEST(SafetensorsAttack, TensorMissingDtypeShapeOrOffsets) {
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"t":{"shape":[1],"data_offsets":[0,1]}})", zeros(1))),
                    ErrorCode::safetensors_header_schema_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"t":{"dtype":"U8","data_offsets":[0,1]}})", zeros(1))),
                    ErrorCode::safetensors_header_schema_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"t":{"dtype":"U8","shape":[1]}})", zeros(1))),
                    ErrorCode::safetensors_header_schema_invalid);
}

TEST(SafetensorsAttack, ExtraKeyInATensorObject) {
  const std::string header = R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"offset":9}})";
  EXPECT_ERROR_CODE(read_bytes(make_file(header, zeros(1))), ErrorCode::safetensors_header_schema_invalid);
}

TEST(SafetensorsAttack, TensorEntryOfTheWrongType) {
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"t":[0,1]})")), ErrorCode::safetensors_header_schema_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"t":"U8"})")), ErrorCode::safetensors_header_schema_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", R"(["1"])", "[0,1]"), zeros(1))),
                    ErrorCode::safetensors_header_schema_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", "[true]", "[0,1]"), zeros(1))),
                    ErrorCode::safetensors_header_schema_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", "1", "[0,1]"), zeros(1))),
                    ErrorCode::safetensors_header_schema_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"t":{"dtype":8,"shape":[1],"data_offsets":[0,1]}})", zeros(1))),
                    ErrorCode::safetensors_header_schema_invalid);
}

TEST(SafetensorsAttack, DataOffsetsThatAreNotAPair) {
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", "[1]", "[0,1,2]"), zeros(1))),
                    ErrorCode::safetensors_header_schema_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", "[1]", "[1]"), zeros(1))),
                    ErrorCode::safetensors_header_schema_invalid);
}

TEST(SafetensorsAttack, UnknownDtype) {
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("F128", "[1]", "[0,16]"), zeros(16))),
                    ErrorCode::safetensors_dtype_unknown);
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("f32", "[1]", "[0,4]"), zeros(4))),
                    ErrorCode::safetensors_dtype_unknown);
}

TEST(SafetensorsAttack, SubByteDtypeWithAPartialByte) {
  // The reference requires the bits to fill whole bytes; it does not round up.
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("F4", "[3]", "[0,2]"), zeros(2))),
                    ErrorCode::safetensors_misaligned_slice);
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("F4", "[]", "[0,1]"), zeros(1))),
                    ErrorCode::safetensors_misaligned_slice);
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("F6_E2M3", "[1]", "[0,1]"), zeros(1))),
                    ErrorCode::safetensors_misaligned_slice);
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("F6_E3M2", "[2,3]", "[0,5]"), zeros(5))),
                    ErrorCode::safetensors_misaligned_slice);
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("F6_E2M3", "[5]", "[0,4]"), zeros(4))),
                    ErrorCode::safetensors_misaligned_slice);
}

TEST(SafetensorsAttack, SubByteDtypeSizedAsWholeBytes) {
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("F4", "[4]", "[0,4]"), zeros(4))),
                    ErrorCode::safetensors_tensor_info_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("F6_E2M3", "[4]", "[0,4]"), zeros(4))),
                    ErrorCode::safetensors_tensor_info_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("F6_E3M2", "[4]", "[0,2]"), zeros(2))),
                    ErrorCode::safetensors_tensor_info_invalid);
}

TEST(SafetensorsReader, ReadsEverySubByteAndFloat8Dtype) {
  struct Case {
    const char* name;
    const char* shape;
    std::size_t bytes;
    DType dtype;
  };
  for (const Case& c : {Case{"F4", "[2,2]", 2, DType::float4_e2m1fn}, Case{"F4", "[0]", 0, DType::float4_e2m1fn},
                        Case{"F6_E2M3", "[4]", 3, DType::float6_e2m3fn},
                        Case{"F6_E3M2", "[2,4]", 6, DType::float6_e3m2fn},
                        Case{"F8_E8M0", "[2]", 2, DType::float8_e8m0fnu},
                        Case{"F8_E4M3FNUZ", "[]", 1, DType::float8_e4m3fnuz}}) {
    SCOPED_TRACE(std::string(c.name) + c.shape);
    const Bytes data = random_bytes(c.bytes, 7);
    const std::string offsets = "[0," + std::to_string(c.bytes) + "]";
    const SafetensorsFile parsed = read_bytes(make_file(one_tensor(c.name, c.shape, offsets), data));
    const TensorData& t = parsed.root.as_dict().at("t").as_tensor();
    EXPECT_EQ(t.dtype, c.dtype);
    EXPECT_EQ(t.logical_bytes(), c.bytes);
    EXPECT_EQ(t.contiguous_bytes(), data);
  }
}

TEST(SafetensorsAttack, IntegersThatAreNotExactU64) {
  for (const char* shape : {"[-1]", "[1.0]", "[1e3]", "[01]", "[18446744073709551616]", "[-0]", "[1E0]"}) {
    SCOPED_TRACE(shape);
    EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", shape, "[0,1]"), zeros(1))),
                      ErrorCode::safetensors_integer_invalid);
  }
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", "[1]", "[0,1.0]"), zeros(1))),
                    ErrorCode::safetensors_integer_invalid);
}

TEST(SafetensorsAttack, LargestU64IsParsedExactlyThenFailsTheExtentChecks) {
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", "[1]", "[0,18446744073709551615]"), zeros(1))),
                    ErrorCode::safetensors_tensor_info_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", "[18446744073709551615]", "[0,18446744073709551615]"))),
                    ErrorCode::safetensors_validation_overflow);
}

TEST(SafetensorsAttack, GapBetweenExtents) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})";
  EXPECT_ERROR_CODE(read_bytes(make_file(header, zeros(3))), ErrorCode::safetensors_offsets_invalid);
}

TEST(SafetensorsAttack, OverlappingExtentsAliasOneBuffer) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})";
  EXPECT_ERROR_CODE(read_bytes(make_file(header, zeros(3))), ErrorCode::safetensors_offsets_invalid);
  const std::string same = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                           R"("b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  EXPECT_ERROR_CODE(read_bytes(make_file(same, zeros(2))), ErrorCode::safetensors_offsets_invalid);
}

TEST(SafetensorsAttack, FirstExtentNotAtZero) {
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", "[1]", "[1,2]"), zeros(2))),
                    ErrorCode::safetensors_offsets_invalid);
}

TEST(SafetensorsAttack, ExtentEndingBeforeItBegins) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("b":{"dtype":"U8","shape":[0],"data_offsets":[2,1]}})";
  EXPECT_ERROR_CODE(read_bytes(make_file(header, zeros(2))), ErrorCode::safetensors_offsets_invalid);
}

TEST(SafetensorsAttack, ShapeTimesElementSizeOverflows) {
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("F32", "[4294967296,4294967296]", "[0,0]"))),
                    ErrorCode::safetensors_validation_overflow);
  // The element count fits, its bit count does not.
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("F64", "[4611686018427387904]", "[0,0]"))),
                    ErrorCode::safetensors_validation_overflow);
  // A zero hides the overflow from a left-to-right product; holdpoint's int64
  // sizes still could not hold the other dimensions.
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", "[0,4294967296,4294967296]", "[0,0]"))),
                    ErrorCode::safetensors_validation_overflow);
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", "[0,9223372036854775808]", "[0,0]"))),
                    ErrorCode::safetensors_validation_overflow);
}

TEST(SafetensorsAttack, ByteLengthDiffersFromShape) {
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("F32", "[2]", "[0,4]"), zeros(4))),
                    ErrorCode::safetensors_tensor_info_invalid);
}

TEST(SafetensorsAttack, TrailingBytesMakeAPolyglot) {
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", "[1]", "[0,1]"), bytes_of("xPK\x05\x06"))),
                    ErrorCode::safetensors_incomplete_buffer);
  EXPECT_ERROR_CODE(read_bytes(make_file("{}", bytes_of("x"))), ErrorCode::safetensors_incomplete_buffer);
}

TEST(SafetensorsAttack, BufferShorterThanTheLastExtent) {
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", "[4]", "[0,4]"), zeros(3))),
                    ErrorCode::safetensors_incomplete_buffer);
  // An extent of 2^60 bytes is validated arithmetically, never touched.
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", "[1152921504606846976]", "[0,1152921504606846976]"))),
                    ErrorCode::safetensors_incomplete_buffer);
}

TEST(SafetensorsAttack, RankAboveTheLimit) {
  Limits limits;
  limits.max_tensor_rank = 4;
  EXPECT_EQ(read_bytes(make_file(one_tensor("U8", "[1,1,1,1]", "[0,1]"), zeros(1)), limits).root.as_dict().size(), 1u);
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", "[1,1,1,1,1]", "[0,1]"), zeros(1)), limits),
                    ErrorCode::tensor_rank_limit);
  std::string shape = "[";
  for (int i = 0; i < 100000; ++i) shape += i ? ",1" : "1";
  shape += "]";
  EXPECT_ERROR_CODE(read_bytes(make_file(one_tensor("U8", shape, "[0,1]"), zeros(1))), ErrorCode::tensor_rank_limit);
}

TEST(SafetensorsAttack, TensorCountAboveTheLimit) {
  Limits limits;
  limits.max_tensors = 2;
  std::string header = "{";
  for (int i = 0; i < 3; ++i) {
    header += (i ? "," : "") + std::string("\"t") + std::to_string(i) + R"(":{"dtype":"U8","shape":[1],"data_offsets":[)" +
              std::to_string(i) + "," + std::to_string(i + 1) + "]}";
  }
  header += "}";
  EXPECT_ERROR_CODE(read_bytes(make_file(header, zeros(3)), limits), ErrorCode::tensor_count_limit);
  limits.max_tensors = 3;
  EXPECT_EQ(read_bytes(make_file(header, zeros(3)), limits).root.as_dict().size(), 3u);
}

TEST(SafetensorsAttack, InvalidUnicodeEscapesInAName) {
  for (const char* name : {R"(\u12G4)", R"(\ud800)", R"(\udc00)", R"(\ud800\u0041)", R"(\ud800x)", R"(\u00)"}) {
    SCOPED_TRACE(name);
    const std::string header = std::string("{\"") + name + "\":" + one_tensor("U8", "[1]", "[0,1]").substr(5);
    EXPECT_ERROR_CODE(read_bytes(make_file(header, zeros(1))), ErrorCode::safetensors_header_invalid);
  }
}

TEST(SafetensorsAttack, InvalidEscapeCharacter) {
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"__metadata__":{"a":"\x41"}})")), ErrorCode::safetensors_header_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"__metadata__":{"a":"\)")), ErrorCode::safetensors_header_invalid);
}

TEST(SafetensorsAttack, RawControlCharacterInAString) {
  EXPECT_ERROR_CODE(read_bytes(make_file("{\"__metadata__\":{\"a\":\"line\nbreak\"}}")),
                    ErrorCode::safetensors_header_invalid);
  EXPECT_ERROR_CODE(read_bytes(make_file(std::string(R"({"__metadata__":{"a":"nul)") + '\0' + "\"}}")),
                    ErrorCode::safetensors_header_invalid);
}

TEST(SafetensorsAttack, EmptyTensorName) {
  EXPECT_ERROR_CODE(read_bytes(make_file(R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", zeros(1))),
                    ErrorCode::safetensors_tensor_name_invalid);
}

TEST(SafetensorsAttack, TensorNameOverTheStringBound) {
  Limits limits;
  limits.max_string_bytes = 8;
  EXPECT_ERROR_CODE(
      read_bytes(make_file(R"({"123456789":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", zeros(1)), limits),
      ErrorCode::safetensors_tensor_name_invalid);
}

TEST(SafetensorsAttack, ElementCountAndByteSizeOverTheLimits) {
  const Bytes file = make_file(one_tensor("F32", "[4]", "[0,16]"), zeros(16));
  Limits limits;
  limits.max_tensor_numel = 3;
  EXPECT_ERROR_CODE(read_bytes(file, limits), ErrorCode::tensor_numel_limit);
  limits = Limits{};
  limits.max_tensor_logical_bytes = 15;
  EXPECT_ERROR_CODE(read_bytes(file, limits), ErrorCode::tensor_bytes_limit);
}

// ---- corruption sweep ------------------------------------------------------------------

// Every single-byte substitution and every truncation of a small valid file
// either throws holdpoint::Error or yields tensors that lie inside the file and
// survive a round trip; substitutions in the data change exactly one tensor.
TEST(SafetensorsCorruption, EverySingleByteSubstitutionAndTruncation) {
  const Value root = dict_of({{"weight", random_tensor(DType::float32, {2}, 1)},
                              {"bias", random_tensor(DType::int8, {3}, 2)},
                              {"step", random_tensor(DType::float16, {}, 3)}});
  const Bytes original = write_bytes(root, {{"k", "v"}});
  const SafetensorsFile reference = read_bytes(original);
  const std::uint64_t data_start = 8 + reference.header_bytes;

  std::size_t rejected = 0, accepted = 0;
  for (std::size_t position = 0; position < original.size(); ++position) {
    for (int value = 0; value < 256; ++value) {
      if (static_cast<std::byte>(value) == original[position]) continue;
      auto file = std::make_shared<Bytes>(original);
      (*file)[position] = static_cast<std::byte>(value);
      SafetensorsFile parsed;
      try {
        parsed = read_safetensors(*file, file, {});
      } catch (const Error&) {
        ++rejected;
        continue;
      }
      ++accepted;
      std::size_t changed = 0;
      for (const auto& [key, tensor] : parsed.root.as_dict()) {
        const Storage& storage = *tensor.as_tensor().storage;
        ASSERT_GE(storage.data(), file->data());
        ASSERT_LE(storage.data() + storage.nbytes(), file->data() + file->size());
        const Value* before = reference.root.as_dict().find(key);
        if (!before || !equal_content(*before, tensor)) ++changed;
      }
      const SafetensorsFile again = read_bytes(write_bytes(parsed.root, parsed.metadata));
      ASSERT_EQ(tensor_mapping_difference(parsed.root, again.root), "") << "position " << position;
      if (position >= data_start) {
        ASSERT_EQ(changed, 1u) << "position " << position;
      }
    }
  }
  EXPECT_GT(rejected, 0u);
  EXPECT_GE(accepted, (original.size() - data_start) * 255);

  for (std::size_t length = 0; length < original.size(); ++length) {
    const Bytes truncated(original.begin(), original.begin() + static_cast<std::ptrdiff_t>(length));
    EXPECT_TRUE(::holdpoint::testing::error_code_of([&] { read_bytes(truncated); }).has_value()) << "length " << length;
  }
  Bytes extended = original;
  extended.push_back(std::byte{0});
  EXPECT_ERROR_CODE(read_bytes(extended), ErrorCode::safetensors_incomplete_buffer);
}

// ---- attacks the writer stops -----------------------------------------------------------

TEST(SafetensorsWriterAttack, RootThatIsNotADict) {
  EXPECT_ERROR_CODE(write_bytes(Value::list({Value::tensor(random_tensor(DType::float32, {1}, 1))})),
                    ErrorCode::convert_not_flat);
  EXPECT_ERROR_CODE(write_bytes(Value::tensor(random_tensor(DType::float32, {1}, 1))), ErrorCode::convert_not_flat);
}

TEST(SafetensorsWriterAttack, ValueThatIsNotATensor) {
  Dict dict;
  dict.insert("n", Value::integer(3));
  EXPECT_ERROR_CODE(write_bytes(Value::dict(dict)), ErrorCode::convert_not_flat);
  Dict nested;
  nested.insert("inner", Value::dict());
  EXPECT_ERROR_CODE(write_bytes(Value::dict(nested)), ErrorCode::convert_not_flat);
}

TEST(SafetensorsWriterAttack, IntegerKey) {
  Dict dict;
  dict.insert(DictKey(std::int64_t{0}), Value::tensor(random_tensor(DType::float32, {1}, 1)));
  EXPECT_ERROR_CODE(write_bytes(Value::dict(dict)), ErrorCode::convert_not_flat);
}

TEST(SafetensorsWriterAttack, DtypeWithoutASafetensorsName) {
  for (DType dtype : {DType::complex128, DType::complex32, DType::bits8, DType::bits16, DType::bits1x8,
                      DType::float4_e2m1fn_x2}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    EXPECT_ERROR_CODE(write_bytes(dict_of({{"z", random_tensor(dtype, {1}, 1)}})), ErrorCode::write_value_unsupported);
  }
}

TEST(SafetensorsWriterAttack, NamesAConformingReaderWouldMisread) {
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"", random_tensor(DType::float32, {1}, 1)}})),
                    ErrorCode::write_value_unsupported);
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"__metadata__", random_tensor(DType::float32, {1}, 1)}})),
                    ErrorCode::write_value_unsupported);
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"bad\xFF", random_tensor(DType::float32, {1}, 1)}})),
                    ErrorCode::write_value_unsupported);
  EXPECT_ERROR_CODE(write_bytes(Value::dict(), {{"k", "\xC0\xAF"}}), ErrorCode::write_value_unsupported);
}

TEST(SafetensorsWriterAttack, ViewReachingOutsideItsStorage) {
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"v", strided_view(DType::float32, {4}, {1}, 1, 4, 1)}})),
                    ErrorCode::tensor_out_of_bounds);
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"v", strided_view(DType::float32, {2, 2}, {4, 1}, 0, 4, 1)}})),
                    ErrorCode::tensor_out_of_bounds);
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"v", strided_view(DType::float32, {2}, {std::int64_t{1} << 62}, 0, 4, 1)}})),
                    ErrorCode::tensor_out_of_bounds);
}

TEST(SafetensorsWriterAttack, IncoherentGeometry) {
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"v", strided_view(DType::float32, {2}, {1, 1}, 0, 4, 1)}})),
                    ErrorCode::tensor_geometry_invalid);
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"v", strided_view(DType::float32, {2}, {-1}, 1, 4, 1)}})),
                    ErrorCode::tensor_geometry_invalid);
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"v", strided_view(DType::float32, {-2}, {1}, 0, 4, 1)}})),
                    ErrorCode::tensor_geometry_invalid);
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"v", strided_view(DType::float32, {std::int64_t{1} << 62, 4}, {0, 0}, 0, 4, 1)}})),
                    ErrorCode::tensor_numel_limit);
}

TEST(SafetensorsWriterAttack, SubByteViewsThatAreNotWholeBytes) {
  const auto f4 = [](std::vector<std::int64_t> sizes, std::vector<std::int64_t> strides, std::int64_t offset,
                     std::size_t storage_bytes) {
    TensorData tensor;
    tensor.dtype = DType::float4_e2m1fn;
    tensor.sizes = std::move(sizes);
    tensor.strides = std::move(strides);
    tensor.storage_offset = offset;
    tensor.storage = Storage::copy_of(random_bytes(storage_bytes, 1));
    return tensor;
  };
  // Elements share bytes: a strided view, or one that starts inside a byte,
  // cannot be gathered byte by byte.
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"v", f4({2, 2}, {1, 2}, 0, 2)}})), ErrorCode::tensor_geometry_invalid);
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"v", f4({2}, {2}, 0, 2)}})), ErrorCode::tensor_geometry_invalid);
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"v", f4({2}, {1}, 1, 2)}})), ErrorCode::tensor_geometry_invalid);
  // An odd count of 4-bit elements ends inside a byte, as the reader refuses too.
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"v", f4({3}, {1}, 0, 2)}})), ErrorCode::safetensors_misaligned_slice);
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"v", f4({}, {}, 0, 1)}})), ErrorCode::safetensors_misaligned_slice);
  EXPECT_ERROR_CODE(write_bytes(dict_of({{"v", f4({4}, {1}, 2, 2)}})), ErrorCode::tensor_out_of_bounds);
  // A byte-aligned slice of a larger storage is fine.
  const TensorData slice = f4({4}, {1}, 2, 3);
  const SafetensorsFile parsed = read_bytes(write_bytes(dict_of({{"v", slice}})));
  EXPECT_EQ(parsed.root.as_dict().at("v").as_tensor().contiguous_bytes(),
            Bytes(slice.storage->bytes().begin() + 1, slice.storage->bytes().end()));
}

TEST(SafetensorsWriterAttack, RejectedInputWritesNothing) {
  io::MemorySink sink;
  const Value root = dict_of({{"a", random_tensor(DType::float32, {1}, 1)}, {"b", random_tensor(DType::complex128, {1}, 2)}});
  EXPECT_ERROR_CODE(write_safetensors(sink, root), ErrorCode::write_value_unsupported);
  EXPECT_EQ(sink.position(), 0u);
}

// ---- the JSON layer on its own ------------------------------------------------------------

TEST(SafetensorsJson, Utf8ValidatorMatchesTheUnicodeTable) {
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("ascii \x7f"));
  EXPECT_TRUE(is_valid_utf8("\xC2\x80 \xDF\xBF \xE0\xA0\x80 \xED\x9F\xBF \xEE\x80\x80 \xF0\x90\x80\x80 \xF4\x8F\xBF\xBF"));
  for (const char* bad : {"\x80", "\xC1\xBF", "\xE0\x9F\xBF", "\xED\xA0\x80", "\xF0\x8F\xBF\xBF", "\xF4\x90\x80\x80",
                          "\xF5\x80\x80\x80", "\xC2", "\xE2\x82"}) {
    EXPECT_FALSE(is_valid_utf8(bad)) << hex_of(bad);
  }
}

TEST(SafetensorsJson, EscapingRoundTripsThroughTheParser) {
  struct Collector final : JsonHandler {
    void begin_object() override {}
    void key(std::string_view) override {}
    void end_object() override {}
    void begin_array() override {}
    void end_array() override {}
    void string_value(std::string_view value) override { strings.emplace_back(value); }
    void number_value(const JsonNumber&) override {}
    void literal_value(JsonLiteral) override {}
    std::vector<std::string> strings;
  };
  std::string every_byte;
  for (int c = 1; c < 0x80; ++c) every_byte.push_back(static_cast<char>(c));
  every_byte += std::string("\0 \xC3\xA9 \xF0\x9F\x98\x80", 9);
  std::string json;
  detail::append_json_string(json, every_byte);
  Collector collector;
  parse_json(json, 4, collector);
  ASSERT_EQ(collector.strings.size(), 1u);
  EXPECT_EQ(collector.strings[0], every_byte);
}

}  // namespace
}  // namespace holdpoint::format
