// A small XML tree: what topology files hold. Parsed with expat; written canonically (attributes
// in their stored order, two-space indent) so that load(dump(x)) == x and dumps compare as text.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weft/status.hpp"

namespace weft::topo {

struct XmlElement {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;
  std::vector<XmlElement> children;
  int line = 0;  // where it started in the source; 0 when built in memory

  const std::string* attr(std::string_view key) const;
  std::string attrOr(std::string_view key, std::string_view fallback) const;
  XmlElement& set(std::string_view key, std::string value);  // replaces or appends
  XmlElement& add(std::string childName);                    // appends a child, returns it

  bool operator==(const XmlElement& o) const {  // lines are where, not what
    return name == o.name && attrs == o.attrs && children == o.children;
  }
};

// Parses a document; errors read "SOURCE:LINE: what".
Result<XmlElement> parseXml(std::string_view text, std::string_view source);
Result<XmlElement> loadXmlFile(const std::string& path);
std::string writeXml(const XmlElement& root);
Status saveXmlFile(const XmlElement& root, const std::string& path);

}  // namespace weft::topo
