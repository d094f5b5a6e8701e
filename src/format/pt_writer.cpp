#include "format/pt_writer.h"

#include <string_view>

#include "format/pickle_writer.h"
#include "format/zip_writer.h"

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

}  // namespace holdpoint::format
