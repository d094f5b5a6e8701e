#include "format/pt_writer.h"

#include <algorithm>
#include <string_view>

#include "base/fail.h"

#include "format/pickle/pickle_writer.h"
#include "format/zip/zip_writer.h"

namespace holdpoint::format {

namespace {
std::span<const std::byte> text_bytes(std::string_view text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}
}  // namespace

PtWriteResult write_pt(io::ByteSink& sink, const Value& root, const PtWriteOptions& options) {
  PickleWriteOptions pickle_options;
  pickle_options.torch_1_13_compatible = options.torch_1_13_compatible;
  pickle_options.limits = options.limits;
  const PickleWriteResult pickled = write_pickle(root, pickle_options);

  ZipWriter zip(sink, options.archive_name);
  try {
    zip.add_record("data.pkl", pickled.pickle);
    zip.add_record("byteorder", text_bytes("little"));
    for (const PickledStorage& storage : pickled.storages) {
      zip.begin_record("data/" + storage.key, storage.nbytes);
      zip.write_stable(storage.storage->bytes().first(storage.nbytes));
      zip.end_record();
    }
    zip.add_record("version", text_bytes("3\n"));
    zip.finish();
  } catch (...) {
    zip.abandon();
    throw;
  }
  return {pickled.tensor_count, pickled.storages.size()};
}

PtWriteResult write_pt_storages_first(io::ByteSink& sink, const Value& provisional_root,
                                      const std::function<Value(const std::vector<WrittenStorage>&)>& final_root,
                                      const PtWriteOptions& options) {
  PickleWriteOptions pickle_options;
  pickle_options.torch_1_13_compatible = options.torch_1_13_compatible;
  pickle_options.limits = options.limits;
  const PickleWriteResult provisional = write_pickle(provisional_root, pickle_options);

  ZipWriter zip(sink, options.archive_name);
  try {
    std::vector<WrittenStorage> written;
    written.reserve(provisional.storages.size());
    io::Xxh3_128 hasher;
    for (const PickledStorage& storage : provisional.storages) {
      // Storages the torch 1.13 mode makes for floats and bytes are new on
      // every pickling; the final pickle's are written after it is known.
      if (storage.synthesized) continue;
      zip.begin_record("data/" + storage.key, storage.nbytes);
      // Digest in pieces that are still in cache when the sink copies them.
      const auto bytes = storage.storage->bytes().first(storage.nbytes);
      constexpr std::size_t kPiece = std::size_t{4} << 20;
      for (std::size_t done = 0; done < bytes.size(); done += kPiece) {
        const auto piece = bytes.subspan(done, std::min(kPiece, bytes.size() - done));
        hasher.update(piece);
        zip.write_stable(piece);
      }
      zip.end_record();
      written.push_back({storage.key, storage.storage->identity(), hasher.finish()});
    }
    const PickleWriteResult pickled = write_pickle(final_root(written), pickle_options);
    std::vector<const PickledStorage*> real, synthesized;
    for (const PickledStorage& storage : pickled.storages) (storage.synthesized ? synthesized : real).push_back(&storage);
    bool same = real.size() == written.size();
    for (std::size_t i = 0; same && i < written.size(); ++i) {
      same = real[i]->key == written[i].key && real[i]->storage->identity() == written[i].identity;
    }
    if (!same) {
      detail::fail(ErrorCode::invalid_argument,
                   "write_pt_storages_first: the final root references other storages than the provisional one");
    }
    for (const PickledStorage* storage : synthesized) {
      zip.begin_record("data/" + storage->key, storage->nbytes);
      zip.write(storage->storage->bytes().first(storage->nbytes));
      zip.end_record();
    }
    zip.add_record("data.pkl", pickled.pickle);
    zip.add_record("byteorder", text_bytes("little"));
    zip.add_record("version", text_bytes("3\n"));
    zip.finish();
    return {pickled.tensor_count, pickled.storages.size()};
  } catch (...) {
    zip.abandon();
    throw;
  }
}

}  // namespace holdpoint::format
