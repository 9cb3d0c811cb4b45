// A file of the given text under /tmp, for tests that read files (tuning files); the caller
// removes it.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <string>

namespace weft::test {

inline std::string tempFileWith(const std::string& text) {
  char path[] = "/tmp/weft-test-XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  FILE* f = fdopen(fd, "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
  return path;
}

}  // namespace weft::test
