#include "topology/xml.hpp"

#include <expat.h>

#include <fstream>
#include <sstream>

namespace weft::topo {

const std::string* XmlElement::attr(std::string_view key) const {
  for (const auto& [k, v] : attrs) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string XmlElement::attrOr(std::string_view key, std::string_view fallback) const {
  const std::string* v = attr(key);
  return v != nullptr ? *v : std::string(fallback);
}

XmlElement& XmlElement::set(std::string_view key, std::string value) {
  for (auto& [k, v] : attrs) {
    if (k == key) {
      v = std::move(value);
      return *this;
    }
  }
  attrs.emplace_back(std::string(key), std::move(value));
  return *this;
}

XmlElement& XmlElement::add(std::string childName) {
  children.push_back({});
  children.back().name = std::move(childName);
  return children.back();
}

namespace {

struct ParseState {
  XML_Parser parser = nullptr;
  XmlElement root;
  std::vector<XmlElement*> stack;
  bool sawRoot = false;
  std::string error;
};

void onStart(void* data, const XML_Char* name, const XML_Char** atts) {
  auto* st = static_cast<ParseState*>(data);
  XmlElement* e = nullptr;
  if (st->stack.empty()) {
    st->root.name = name;
    st->sawRoot = true;
    e = &st->root;
  } else {
    e = &st->stack.back()->add(name);
  }
  e->line = static_cast<int>(XML_GetCurrentLineNumber(st->parser));
  for (int i = 0; atts[i] != nullptr; i += 2) e->attrs.emplace_back(atts[i], atts[i + 1]);
  st->stack.push_back(e);
}

void onEnd(void* data, const XML_Char*) {
  static_cast<ParseState*>(data)->stack.pop_back();
}

void escape(std::string& out, const std::string& s) {
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
}

void write(std::string& out, const XmlElement& e, int depth) {
  out.append(static_cast<std::size_t>(depth) * 2, ' ');
  out += "<" + e.name;
  for (const auto& [k, v] : e.attrs) {
    out += " " + k + "=\"";
    escape(out, v);
    out += "\"";
  }
  if (e.children.empty()) {
    out += "/>\n";
    return;
  }
  out += ">\n";
  for (const XmlElement& c : e.children) write(out, c, depth + 1);
  out.append(static_cast<std::size_t>(depth) * 2, ' ');
  out += "</" + e.name + ">\n";
}

}  // namespace

Result<XmlElement> parseXml(std::string_view text, std::string_view source) {
  ParseState st;
  st.parser = XML_ParserCreate(nullptr);
  if (st.parser == nullptr) return Status(Code::systemError, "expat: out of memory");
  XML_SetUserData(st.parser, &st);
  XML_SetElementHandler(st.parser, onStart, onEnd);
  const bool ok =
      XML_Parse(st.parser, text.data(), static_cast<int>(text.size()), XML_TRUE) == XML_STATUS_OK;
  std::string message;
  if (!ok) {
    message = std::string(source) + ":" + std::to_string(XML_GetCurrentLineNumber(st.parser)) +
              ": " + XML_ErrorString(XML_GetErrorCode(st.parser));
  }
  XML_ParserFree(st.parser);
  if (!ok) return invalidArgument(message);
  if (!st.sawRoot) return invalidArgument(std::string(source) + ":1: no root element");
  return std::move(st.root);
}

Result<XmlElement> loadXmlFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalidArgument(path + ": cannot open the file for reading");
  std::stringstream ss;
  ss << in.rdbuf();
  return parseXml(ss.str(), path);
}

std::string writeXml(const XmlElement& root) {
  std::string out;
  write(out, root, 0);
  return out;
}

Status saveXmlFile(const XmlElement& root, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return {Code::systemError, path + ": cannot open the file for writing"};
  out << writeXml(root);
  out.close();
  if (!out) return {Code::systemError, path + ": write failed"};
  return {};
}

}  // namespace weft::topo
