// weft-config: the runtime's settings (environment variables) from their table (config.cpp):
// what this environment sets and whether the runtime accepts it, or the tables as Markdown.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "src/core/config.hpp"
#include "src/tools/cli.hpp"

int main(int argc, char** argv) {
  using weft::Audience;
  CLI::App app{
      "weft-config: every setting, its value here (or its default), and whether the runtime "
      "accepts this environment (exit 1 when it does not)"};
  weft::tools::addVersionFlag(app, "weft-config");
  std::string markdown;
  app.add_option("--markdown", markdown, "print one audience's table as Markdown instead")
      ->check(CLI::IsMember({"user", "tuning", "diagnostic"}));
  if (auto rc = weft::tools::parse(app, argc, argv)) return *rc;
  if (!markdown.empty()) {
    std::fputs(weft::settingsMarkdown(markdown == "user"     ? Audience::user
                                      : markdown == "tuning" ? Audience::tuning
                                                             : Audience::diagnostic)
                   .c_str(),
               stdout);
    return weft::tools::kExitOk;
  }
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
    return weft::tools::kExitFailed;
  }
  return weft::tools::kExitOk;
}
