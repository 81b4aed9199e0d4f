// keel's binding of PyTorch's own collectives (c10d) for the learner ranks.
//
// A C ABI over TCPStore (rendezvous), ProcessGroupGloo (CPU collectives) and, when
// learner/build.rs found a CUDA libtorch with NCCL's and CUDA's headers (KEEL_C10D_NCCL),
// ProcessGroupNCCL (GPU collectives), compiled against the headers of the same libtorch wheel
// tch links. A group always has Gloo; with a CUDA device it also has NCCL, and each collective
// runs on the backend of its tensor's device (CPU: Gloo, CUDA: NCCL), as PyTorch's own
// multi-backend process groups do. Every entry point catches C++ exceptions and returns them
// as a message: nothing throws across the ABI. Tensors cross as tch's handle (`at::Tensor*`,
// torch-sys's `tensor` typedef).
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef KEEL_C10D_NCCL
#include <cstdlib>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace {

struct Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  // Null without a CUDA device.
  c10::intrusive_ptr<c10d::Backend> nccl;
  std::chrono::milliseconds timeout;

  // The backend of `tensor`'s device.
  c10d::Backend& on(const at::Tensor& tensor) const {
    if (!tensor.is_cuda()) {
      return *backend;
    }
    if (!nccl) {
      throw std::invalid_argument("a CUDA tensor in a group without NCCL (joined without a CUDA device)");
    }
    return *nccl;
  }
};

// NCCL on `device` over `store`, connected now so a missing GPU or a failed NCCL init fails the
// join, not the first collective. Blocking wait makes `Work::wait(timeout)` throw on a timeout
// instead of the watchdog aborting the process.
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store,
                                            int rank, int world, int device,
                                            std::chrono::milliseconds timeout) {
#ifdef KEEL_C10D_NCCL
  setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 0);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, options);
  at::Device cuda(at::kCUDA, static_cast<c10::DeviceIndex>(device));
  nccl->setBoundDeviceId(cuda);
  nccl->eagerConnectSingleDevice(cuda);
  return nccl;
#else
  (void)store, (void)rank, (void)world, (void)device, (void)timeout;
  throw std::runtime_error(
      "NCCL is not compiled into this keel: it was built against a libtorch without CUDA, or "
      "without NCCL's and CUDA's headers (learner/build.rs; scripts/setup.sh installs them)");
#endif
}

char* copy_message(const std::string& message) {
  char* out = static_cast<char*>(std::malloc(message.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, message.c_str(), message.size() + 1);
  }
  return out;
}

template <typename F>
int guarded(char** error, F&& body) {
  try {
    body();
    return 0;
  } catch (const c10::Error& e) {
    // c10's what() appends a C++ backtrace; the message alone is what a user needs.
    *error = copy_message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    *error = copy_message(e.what());
  } catch (...) {
    *error = copy_message("unknown C++ exception");
  }
  return 1;
}

void finish(std::chrono::milliseconds timeout, const c10::intrusive_ptr<c10d::Work>& work) {
  work->wait(timeout);
}

}  // namespace

extern "C" {

void keel_c10d_free_message(char* message) { std::free(message); }

// 1 when NCCL is compiled in (KEEL_C10D_NCCL), else 0.
int keel_c10d_has_nccl() {
#ifdef KEEL_C10D_NCCL
  return 1;
#else
  return 0;
#endif
}

// Rendezvous at host:port (rank 0 serves the TCPStore) and build a Gloo group of `world` ranks,
// and an NCCL one on CUDA device `cuda_device` unless it is negative.
int keel_c10d_group_new(const char* host, uint16_t port, int rank, int world,
                        int64_t timeout_ms, int cuda_device, Group** out, char** error) {
  return guarded(error, [&] {
    std::chrono::milliseconds timeout(timeout_ms);
    c10d::TCPStoreOptions options;
    options.port = port;
    options.isServer = rank == 0;
    options.numWorkers = static_cast<std::size_t>(world);
    options.waitWorkers = true;
    options.timeout = timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host), options);
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::PrefixStore>("keel", tcp);
    auto gloo_store = c10::make_intrusive<c10d::PrefixStore>("gloo", store);
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
    gloo_options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(std::string(host)));
    gloo_options->threads = 2;
    auto backend =
        c10::make_intrusive<c10d::ProcessGroupGloo>(gloo_store, rank, world, gloo_options);
    c10::intrusive_ptr<c10d::Backend> nccl;
    if (cuda_device >= 0) {
      auto nccl_store = c10::make_intrusive<c10d::PrefixStore>("nccl", store);
      nccl = make_nccl(nccl_store, rank, world, cuda_device, timeout);
    }
    *out = new Group{store, backend, nccl, timeout};
  });
}

// Frees the group; NCCL's communicators are aborted first (never waiting on a dead peer, as a
// graceful shutdown could), so that its destructor does not wait either.
void keel_c10d_free(Group* group) {
  if (group != nullptr && group->nccl) {
    try {
      group->nccl->abort();
    } catch (...) {
    }
  }
  delete group;
}

// Sum `tensor` over the ranks, in place.
int keel_c10d_all_reduce_sum(Group* group, at::Tensor* tensor, char** error) {
  return guarded(error, [&] {
    std::vector<at::Tensor> tensors{*tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    options.timeout = group->timeout;
    finish(group->timeout, group->on(*tensor).allreduce(tensors, options));
  });
}

// Overwrite `tensor` on every rank with its value on `root`, waiting up to `timeout_ms`
// (0: the group's timeout).
int keel_c10d_broadcast(Group* group, at::Tensor* tensor, int root, int64_t timeout_ms,
                        char** error) {
  return guarded(error, [&] {
    std::vector<at::Tensor> tensors{*tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.rootTensor = 0;
    options.timeout =
        timeout_ms > 0 ? std::chrono::milliseconds(timeout_ms) : group->timeout;
    finish(options.timeout, group->on(*tensor).broadcast(tensors, options));
  });
}

// Gather every rank's `input` into `outputs[r]` (one tensor per rank, each shaped as input).
int keel_c10d_all_gather(Group* group, at::Tensor* input, at::Tensor** outputs, int count,
                         char** error) {
  return guarded(error, [&] {
    std::vector<at::Tensor> inputs{*input};
    std::vector<std::vector<at::Tensor>> gathered(1);
    for (int r = 0; r < count; ++r) {
      gathered[0].push_back(*outputs[r]);
    }
    c10d::AllgatherOptions options;
    options.timeout = group->timeout;
    finish(group->timeout, group->on(*input).allgather(gathered, inputs, options));
  });
}

int keel_c10d_barrier(Group* group, char** error) {
  return guarded(error, [&] {
    c10d::BarrierOptions options;
    options.timeout = group->timeout;
    finish(group->timeout, group->backend->barrier(options));
  });
}

// Rendezvous key-value: set `key` to `value` (bytes).
int keel_c10d_store_set(Group* group, const char* key, const uint8_t* value, size_t len,
                        char** error) {
  return guarded(error, [&] {
    group->store->set(std::string(key), std::vector<uint8_t>(value, value + len));
  });
}

// Wait (up to the group's timeout) for `key` and return its value; free with
// keel_c10d_free_message.
int keel_c10d_store_get(Group* group, const char* key, uint8_t** value, size_t* len,
                        char** error) {
  return guarded(error, [&] {
    std::vector<uint8_t> bytes = group->store->get(std::string(key));
    auto* out = static_cast<uint8_t*>(std::malloc(bytes.size() + 1));
    if (out == nullptr) {
      throw std::bad_alloc();
    }
    std::memcpy(out, bytes.data(), bytes.size());
    *value = out;
    *len = bytes.size();
  });
}

}  // extern "C"
