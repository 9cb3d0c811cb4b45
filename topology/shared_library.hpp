// A library opened with dlopen and closed when it goes out of scope, its entry points bound by
// name: how discovery reaches NVML and the CUDA driver without linking against either.
#pragma once

#include <dlfcn.h>

#include <string>
#include <utility>

#include "weft/status.hpp"

namespace weft::topo {

class SharedLibrary {
 public:
  // `what` names the library in the error ("NVML", "CUDA driver").
  static Result<SharedLibrary> open(const std::string& path, const std::string& what) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = dlerror();
      return unsupported(what + " not available (" + path + ": " + (why ? why : "dlopen failed") +
                         ")");
    }
    return SharedLibrary(h);
  }

  SharedLibrary() = default;
  SharedLibrary(SharedLibrary&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  SharedLibrary& operator=(SharedLibrary&& o) noexcept {
    std::swap(handle_, o.handle_);
    return *this;
  }
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;
  ~SharedLibrary() {
    if (handle_ != nullptr) dlclose(handle_);
  }

  // Points fn at the symbol; false when the library lacks it.
  template <typename F>
  bool bind(const char* symbol, F& fn) const {
    fn = reinterpret_cast<F>(dlsym(handle_, symbol));
    return fn != nullptr;
  }

 private:
  explicit SharedLibrary(void* h) : handle_(h) {}
  void* handle_ = nullptr;
};

}  // namespace weft::topo
