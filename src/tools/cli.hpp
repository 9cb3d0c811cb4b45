// One command-line convention for weft's tools (weft-perf, weft-plan, weft-topo, weft-config):
// exit 0 when the work succeeded, 1 when it failed, 2 for bad usage; --version on each.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "weft/weft.h"

namespace weft::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

// "0.1.0": the version of weft.h the tool was built with.
inline std::string version() {
  return std::to_string(WEFT_VERSION_MAJOR) + "." + std::to_string(WEFT_VERSION_MINOR) + "." +
         std::to_string(WEFT_VERSION_PATCH);
}

// "weft-plan 0.1.0": what --version prints.
inline std::string versionLine(const std::string& tool) {
  return tool + " " + version();
}

inline void addVersionFlag(CLI::App& app, const std::string& tool) {
  app.set_version_flag("--version", versionLine(tool));
}

// Parses argv. nullopt: go on; otherwise the code to exit with, after --help or --version (0) or
// a usage error (2; CLI11's own codes are folded into it), CLI11 having printed what it should.
inline std::optional<int> parse(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
}

}  // namespace weft::tools
