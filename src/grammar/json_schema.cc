// JsonSchemaToGbnf (see json_schema.h): one rule per schema node, named after its JSON pointer,
// over a fixed set of JSON primitives.
#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

namespace kvq {
namespace {

using Json = nlohmann::ordered_json;  // properties keep the schema's order

// The JSON primitives every schema grammar may use.
constexpr const char* kPrimitives = R"(ws ::= ( " " | "\n" [ \t]{0,20} )?
json-char ::= [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
json-string ::= "\"" json-char* "\""
json-integer ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
json-number ::= json-integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-member ::= json-string ws ":" ws json-value ws
json-object ::= "{" ws ( json-member ( "," ws json-member )* )? "}"
json-array ::= "[" ws ( json-value ws ( "," ws json-value ws )* )? "]"
)";

struct SchemaError {
  std::string message;
};

// A GBNF string literal holding `text` (UTF-8 passed through; quotes, backslashes and control
// characters escaped).
std::string Literal(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7F) {
      out += fmt::format("\\x{:02X}", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json& document) : document_(document) {}

  std::string Compile() {
    const std::string root = Visit(document_, "", "root");
    std::string out = kPrimitives;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    (void)root;
    return out;
  }

 private:
  [[noreturn]] static void Fail(const std::string& pointer, const std::string& what) {
    throw SchemaError{fmt::format("at '{}': {}", pointer.empty() ? "/" : pointer, what)};
  }

  // A new rule name from a JSON pointer: letters, digits and '-' only, unique.
  std::string NameFor(const std::string& pointer) {
    std::string name = "schema";
    for (char c : pointer) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      name += ok ? c : '-';
    }
    std::string unique = name;
    for (int i = 2; rules_.count(unique) > 0 || unique == "root"; ++i) unique = fmt::format("{}-{}", name, i);
    rules_[unique] = "";  // reserved until its body is set
    return unique;
  }

  // Defines a rule for the schema at `pointer` (named `name` if given) and returns its name.
  std::string Visit(const Json& s, const std::string& pointer, std::string name = "") {
    if (name.empty()) name = NameFor(pointer);
    rules_[name] = "";
    rules_[name] = Body(s, pointer);
    return name;
  }

  std::string Body(const Json& s, const std::string& pointer) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) Fail(pointer, "the schema false accepts nothing");
      return "json-value";
    }
    if (!s.is_object()) Fail(pointer, "expected a schema (a JSON object or a boolean)");
    static const std::set<std::string> kKnown = {
        "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
        "maxLength", "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions", "title", "description",
        "$schema", "$id", "$comment", "default", "examples"};
    for (const auto& [key, value] : s.items()) {
      if (kKnown.count(key) == 0) {
        Fail(pointer, fmt::format("unsupported keyword '{}' (supported: type, properties, required, "
                                  "additionalProperties, items, minItems, maxItems, minLength, maxLength, enum, "
                                  "const, anyOf, oneOf, $ref, $defs, definitions)", key));
      }
    }
    if (s.contains("$ref")) {
      if (s.size() > 1) {
        for (const auto& [key, value] : s.items()) {
          static const std::set<std::string> kBeside = {"$ref", "title", "description", "$comment", "$schema",
                                                        "$id", "$defs", "definitions"};
          if (kBeside.count(key) == 0) {
            Fail(pointer, fmt::format("'{}' beside '$ref' is not supported", key));
          }
        }
      }
      return Ref(s["$ref"], pointer + "/$ref");
    }
    if (s.contains("const")) return Literal(s["const"].dump());
    if (s.contains("enum")) {
      const Json& values = s["enum"];
      if (!values.is_array() || values.empty()) Fail(pointer + "/enum", "expected a non-empty array of values");
      std::string alternatives;
      for (const Json& v : values) alternatives += (alternatives.empty() ? "" : " | ") + Literal(v.dump());
      return alternatives;
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const Json& branches = s[key];
      if (!branches.is_array() || branches.empty()) Fail(pointer + "/" + key, "expected a non-empty array of schemas");
      if (s.contains("type")) Fail(pointer, fmt::format("'type' beside '{}' is not supported", key));
      std::string alternatives;
      for (size_t i = 0; i < branches.size(); ++i) {
        alternatives += (i ? " | " : "") + Visit(branches[i], fmt::format("{}/{}/{}", pointer, key, i));
      }
      return alternatives;
    }
    if (!s.contains("type")) {
      for (const char* key : {"properties", "required", "items", "minItems", "maxItems", "minLength", "maxLength"}) {
        if (s.contains(key)) Fail(pointer, fmt::format("'{}' needs a 'type' beside it", key));
      }
      return "json-value";
    }
    const Json& type = s["type"];
    if (type.is_string()) return OfType(s, type.get<std::string>(), pointer);
    if (!type.is_array() || type.empty()) Fail(pointer + "/type", "expected a type name or a non-empty list of them");
    std::string alternatives;
    for (const Json& t : type) {
      if (!t.is_string()) Fail(pointer + "/type", "expected type names");
      alternatives += (alternatives.empty() ? "( " : " | ") + OfType(s, t.get<std::string>(), pointer);
    }
    return alternatives + " )";
  }

  std::string Ref(const Json& ref, const std::string& pointer) {
    if (!ref.is_string()) Fail(pointer, "expected a string");
    const std::string target = ref.get<std::string>();
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    std::string section, name;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      if (target.rfind(prefix, 0) == 0) {
        section = std::string(prefix).substr(2, std::string(prefix).size() - 3);
        name = target.substr(std::string(prefix).size());
      }
    }
    if (section.empty() || name.empty() || name.find('/') != std::string::npos) {
      Fail(pointer, fmt::format("'{}' is not a local reference '#/$defs/NAME' or '#/definitions/NAME'", target));
    }
    if (!document_.contains(section) || !document_[section].contains(name)) {
      Fail(pointer, fmt::format("'{}' does not resolve: the schema has no {}/{}", target, section, name));
    }
    const std::string rule = NameFor("/" + section + "/" + name);
    refs_[target] = rule;  // before visiting: a recursive reference finds the rule
    Visit(document_[section][name], "/" + section + "/" + name, rule);
    return rule;
  }

  static int64_t Count(const Json& s, const char* key, const std::string& pointer, int64_t none) {
    if (!s.contains(key)) return none;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 10000) {
      Fail(pointer + "/" + key, "expected an integer in [0, 10000]");
    }
    return v.get<int64_t>();
  }

  static std::string Repeat(const std::string& item, int64_t min, int64_t max) {
    if (max < 0) return fmt::format("{}{{{},}}", item, min);
    return fmt::format("{}{{{},{}}}", item, min, max);
  }

  // Keywords that belong to another type are refused (they would constrain nothing here).
  static void OnlyFor(const Json& s, const std::string& type, const std::string& pointer,
                      std::initializer_list<const char*> keys) {
    for (const char* key : keys) {
      if (s.contains(key)) Fail(pointer, fmt::format("'{}' does not apply to type '{}'", key, type));
    }
  }

  std::string OfType(const Json& s, const std::string& type, const std::string& pointer) {
    const bool multi = s["type"].is_array();
    if (type != "object" && !multi) OnlyFor(s, type, pointer, {"properties", "required", "additionalProperties"});
    if (type != "array" && !multi) OnlyFor(s, type, pointer, {"items", "minItems", "maxItems"});
    if (type != "string" && !multi) OnlyFor(s, type, pointer, {"minLength", "maxLength"});
    if (type == "null") return "json-null";
    if (type == "boolean") return "json-boolean";
    if (type == "integer") return "json-integer";
    if (type == "number") return "json-number";
    if (type == "string") {
      const int64_t min = Count(s, "minLength", pointer, 0), max = Count(s, "maxLength", pointer, -1);
      if (max >= 0 && max < min) Fail(pointer, "maxLength is below minLength");
      if (min == 0 && max < 0) return "json-string";
      return "\"\\\"\" " + Repeat("json-char", min, max) + " \"\\\"\"";
    }
    if (type == "array") return Array(s, pointer);
    if (type == "object") return Object(s, pointer);
    Fail(pointer + "/type", fmt::format("unknown type '{}' (object, array, string, number, integer, boolean, null)", type));
  }

  std::string Array(const Json& s, const std::string& pointer) {
    if (s.contains("items") && s["items"].is_array()) Fail(pointer + "/items", "tuple 'items' (a list) is not supported");
    const std::string item = s.contains("items") ? Visit(s["items"], pointer + "/items") : "json-value";
    const int64_t min = Count(s, "minItems", pointer, 0), max = Count(s, "maxItems", pointer, -1);
    if (max >= 0 && max < min) Fail(pointer, "maxItems is below minItems");
    if (max == 0) return "\"[\" ws \"]\"";
    const std::string more = "( \",\" ws " + item + " ws )";
    const std::string tail = Repeat(more, min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1);
    const std::string items = item + " ws " + tail;
    return "\"[\" ws " + (min == 0 ? "( " + items + " )?" : items) + " \"]\"";
  }

  std::string Object(const Json& s, const std::string& pointer) {
    if (s.contains("additionalProperties")) {
      const Json& extra = s["additionalProperties"];
      if (!extra.is_boolean() && !extra.is_object()) Fail(pointer + "/additionalProperties", "expected a boolean or a schema");
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      const Json& r = s["required"];
      if (!r.is_array()) Fail(pointer + "/required", "expected an array of property names");
      for (const Json& k : r) {
        if (!k.is_string()) Fail(pointer + "/required", "expected property names (strings)");
        required.insert(k.get<std::string>());
      }
    }
    if (!s.contains("properties")) {
      if (!required.empty()) Fail(pointer + "/required", "required keys need 'properties' describing them");
      return "json-object";
    }
    const Json& properties = s["properties"];
    if (!properties.is_object()) Fail(pointer + "/properties", "expected an object of schemas");
    for (const std::string& k : required) {
      if (!properties.contains(k)) Fail(pointer + "/required", fmt::format("'{}' is required but not in 'properties'", k));
    }
    struct Member {
      std::string rule;
      bool required;
    };
    std::vector<Member> members;
    for (const auto& [key, schema] : properties.items()) {
      const std::string value = Visit(schema, pointer + "/properties/" + key);
      const std::string rule = NameFor(pointer + "/properties/" + key + "-kv");
      rules_[rule] = Literal(Json(key).dump()) + " ws \":\" ws " + value + " ws";
      members.push_back({rule, required.count(key) > 0});
    }
    // Keys in the schema's order; an optional one may be left out. An alternative per member that
    // can come first (every member before it optional); after it each member with its comma,
    // optional ones in ( )?.
    std::string alternatives;
    bool all_optional = true;
    for (size_t first = 0; first < members.size(); ++first) {
      std::string alt = members[first].rule;
      for (size_t j = first + 1; j < members.size(); ++j) {
        alt += members[j].required ? " \",\" ws " + members[j].rule : " ( \",\" ws " + members[j].rule + " )?";
      }
      alternatives += (alternatives.empty() ? "" : " | ") + alt;
      if (members[first].required) {
        all_optional = false;
        break;
      }
    }
    if (members.empty()) return "\"{\" ws \"}\"";
    return "\"{\" ws ( " + alternatives + " )" + (all_optional ? "?" : "") + " \"}\"";
  }

  const Json& document_;
  std::map<std::string, std::string> rules_;  // name -> body
  std::map<std::string, std::string> refs_;   // "$ref" text -> rule
};

}  // namespace

Result<std::string> JsonSchemaToGbnf(std::string_view schema_json) {
  Json document;
  try {
    document = Json::parse(schema_json);
  } catch (const Json::parse_error& e) {
    return Status::Error(fmt::format("not JSON: {}", e.what()));
  }
  try {
    return SchemaCompiler(document).Compile();
  } catch (const SchemaError& e) {
    return Status::Error(e.message);
  }
}

std::string JsonObjectGbnf() { return std::string(kPrimitives) + "root ::= json-object\n"; }

}  // namespace kvq
