// Saves the state of a small LibTorch model as a PyTorch-compatible checkpoint
// (with a sha256sum sidecar), reloads it into a fresh model through the
// restricted reader, and checks every tensor came back bit for bit.
//
//   save_small_model OUT.pt
//
// Python can open OUT.pt with torch.load(OUT.pt, weights_only=True).
#include <torch/torch.h>

#include <iostream>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/tensor/torch_tensor.h"

namespace {

struct SmallNet : torch::nn::Module {
  SmallNet() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)));
    norm = register_module("norm", torch::nn::BatchNorm2d(4));
    head = register_module("head", torch::nn::Linear(4 * 6 * 6, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(norm->forward(conv->forward(x)));
    return head->forward(x.flatten(1));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d norm{nullptr};
  torch::nn::Linear head{nullptr};
};

holdpoint::Value state_dict(const torch::nn::Module& module) {
  holdpoint::Dict entries;
  for (const auto& item : module.named_parameters()) {
    entries.insert(item.key(), holdpoint::tensor_value(item.value().detach()));
  }
  for (const auto& item : module.named_buffers()) {
    entries.insert(item.key(), holdpoint::tensor_value(item.value()));
  }
  return holdpoint::Value::ordered_dict(std::move(entries));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " OUT.pt\n";
    return 2;
  }
  try {
    torch::manual_seed(0);
    SmallNet model;
    model.train();
    model.forward(torch::randn({8, 1, 8, 8}));  // moves the BatchNorm running statistics

    holdpoint::SaveOptions options;
    options.write_sidecar = true;
    const auto saved = holdpoint::save_mapping(argv[1], state_dict(model), options);
    std::cout << "saved " << saved.tensor_count << " tensors to " << argv[1] << " (" << saved.file_bytes
              << " bytes, sha256 " << saved.sha256.hex() << ")\n";

    holdpoint::LoadOptions load_options;
    load_options.expected_sha256 = saved.sha256;
    const auto loaded = holdpoint::load_checkpoint_mapping(argv[1], load_options);
    torch::manual_seed(1);
    SmallNet fresh;
    torch::NoGradGuard no_grad;
    std::size_t restored = 0;
    for (auto& item : fresh.named_parameters()) {
      item.value().copy_(holdpoint::to_at_tensor(loaded.root.as_dict().at(item.key()).as_tensor()));
      ++restored;
    }
    for (auto& item : fresh.named_buffers()) {
      item.value().copy_(holdpoint::to_at_tensor(loaded.root.as_dict().at(item.key()).as_tensor()));
      ++restored;
    }
    for (const auto& item : model.named_parameters()) {
      if (!torch::equal(item.value(), fresh.named_parameters()[item.key()])) {
        std::cerr << "mismatch in " << item.key() << "\n";
        return 1;
      }
    }
    std::cout << "reloaded " << restored << " tensors into a fresh model through the restricted reader: identical\n";
    return 0;
  } catch (const holdpoint::Error& error) {
    std::cerr << "error: " << holdpoint::error_code_name(error.code()) << ": " << error.what() << "\n";
    return 1;
  }
}
