// JSON Schema to GBNF (grammar.h): the grammar of the JSON texts a schema accepts, for the subset:
//
//   type            object, array, string, number, integer, boolean, null, or a list of them
//   properties      keys in the schema's order; required      keys that must appear
//   additionalProperties  true, false or a schema: keys outside `properties` are never generated
//                   (valid whatever it says); an object schema without `properties` takes any keys
//   items (one schema), minItems, maxItems
//   minLength, maxLength (characters, an escape counting as one)
//   enum, const     the values, each written as compact JSON
//   anyOf, oneOf    alternatives (oneOf as anyOf: a text matching two branches is not excluded)
//   $ref            "#/$defs/NAME" or "#/definitions/NAME" (recursion allowed)
//   annotations     title, description, $schema, $id, $comment, default, examples (no effect)
//
// Any other keyword (pattern, format, minimum, ...) is refused with an error naming it and where
// it is, never ignored. The JSON written is compact but may hold bounded whitespace (a space, or a
// new line and up to 20 spaces or tabs, between tokens); numbers have at most 16 integral and 16
// fractional digits and a 2-digit exponent (so every one is a finite double).
#pragma once

#include <string>
#include <string_view>

#include "kvq/status.h"

namespace kvq {

/// The GBNF of the JSON texts `schema_json` (a JSON Schema as text) accepts; its start rule is
/// "root". Errors: text that is not JSON; unsupported keywords or values (named, with the JSON
/// pointer of the schema holding them); a $ref that does not resolve.
Result<std::string> JsonSchemaToGbnf(std::string_view schema_json);

/// The GBNF of any JSON object (OpenAI's response_format {"type": "json_object"}).
std::string JsonObjectGbnf();

}  // namespace kvq
