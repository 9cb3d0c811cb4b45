// weft-config: the runtime's settings (environment variables) from their table (config.cpp):
// what this environment sets and whether the runtime accepts it, or the tables as Markdown.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "src/core/config.hpp"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: weft-config [--markdown user|tuning|diagnostic]\n"
               "  without arguments: every setting, its value here (or its default), and whether\n"
               "  the runtime accepts this environment (exit 2 when it does not)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using weft::Audience;
  if (argc == 3 && std::strcmp(argv[1], "--markdown") == 0) {
    const std::string which = argv[2];
    if (which != "user" && which != "tuning" && which != "diagnostic") return usage();
    std::fputs(weft::settingsMarkdown(which == "user"     ? Audience::user
                                      : which == "tuning" ? Audience::tuning
                                                          : Audience::diagnostic)
                   .c_str(),
               stdout);
    return 0;
  }
  if (argc != 1) return usage();
  for (const weft::SettingDoc& d : weft::settingsTable()) {
    const char* v = std::getenv(d.name.c_str());
    const char* via = d.name.c_str();
    if ((v == nullptr || *v == '\0') && !d.alias.empty()) {
      v = std::getenv(d.alias.c_str());
      via = d.alias.c_str();
    }
    const bool set = v != nullptr && *v != '\0';
    std::printf("%-32s %s%s%s\n", d.name.c_str(), set ? v : d.fallback.c_str(),
                set ? "" : " (default)",
                set && via != d.name.c_str() ? (std::string(" (from ") + via + ")").c_str() : "");
  }
  auto config = weft::Config::fromEnvironment();
  if (!config) {
    std::fprintf(stderr, "weft-config: %s\n", config.status().message().c_str());
    return 2;
  }
  return 0;
}
