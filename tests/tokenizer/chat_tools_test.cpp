// Tools in the prompt (spec model-v41.md §7.3, §7.5): tools block placement, DSML rendering of
// assistant tool calls with every JSON type, tool results merged and re-ordered, V4 vs V4.1
// tag names and argument rules; Python-compatible JSON; template data files.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tokenizer/chat_encoder.h"
#include "tokenizer/chat_request.h"

namespace flashseek::tok {
namespace {

using namespace chat_tokens;
const std::string BOS(kBos), EOS(kEos), SYS(kSystem), USR(kUser), AST(kAssistant), TH(kThinkStart),
    ETH(kThinkEnd);

std::string read_data(const std::string& name) {
  std::ifstream f(std::string(FLASHSEEK_SOURCE_DIR) + "/data/chat/" + name, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const char* kWeatherTool = R"({"type":"function","function":{"name":"get_weather",
  "description":"Weather in a city","parameters":{"type":"object",
  "properties":{"city":{"type":"string"}},"required":["city"]}}})";
const std::string kWeatherSchema =
    R"({"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", )"
    R"("properties": {"city": {"type": "string"}}, "required": ["city"]}})";

TEST(ChatFormat, CompiledTemplatesEqualDataFiles) {
  EXPECT_EQ(std::string(tools_template(ChatFamily::kV41)), read_data("tools_template_v41.txt"));
  EXPECT_EQ(std::string(tools_template(ChatFamily::kV4)), read_data("tools_template_v4.txt"));
  EXPECT_EQ(std::string(v4_max_effort_text()), read_data("reasoning_effort_max_v4.txt"));
  EXPECT_FALSE(read_data("tools_template_v41.txt").empty());
}

TEST(ChatFormat, ToolsBlockFillsEveryPlaceholder) {
  for (ChatFamily f : {ChatFamily::kV41, ChatFamily::kV4}) {
    const std::string block = render_tools_block(f, "{\"name\": \"x\"}");
    EXPECT_EQ(block.find("{dsml_token}"), std::string::npos);
    EXPECT_EQ(block.find("_name}"), std::string::npos);
    EXPECT_EQ(block.find("_token}"), std::string::npos);
    EXPECT_NE(block.find("### Available Tool Schemas\n\n{\"name\": \"x\"}\n\nYou MUST strictly follow"),
              std::string::npos);
    EXPECT_EQ(block.substr(0, 10), "## Tools\n\n");
    EXPECT_EQ(block.back(), '\n');
  }
  EXPECT_NE(render_tools_block(ChatFamily::kV41, "").find("<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"$TOOL_NAME\">"),
            std::string::npos);
  EXPECT_NE(render_tools_block(ChatFamily::kV4, "").find("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">"),
            std::string::npos);
}

TEST(ChatPyJson, MatchesPythonJsonDumps) {
  EXPECT_EQ(py_json_dumps(ChatJson::parse(R"({"s":"a\"b\\c\n\t\u0001 é/","n":null,"l":[1,2.0,{}],"e":[]})")),
            R"({"s": "a\"b\\c\n\t\u0001 é/", "n": null, "l": [1, 2.0, {}], "e": []})");
  // Key order is the request's, not sorted.
  EXPECT_EQ(py_json_dumps(ChatJson::parse(R"({"z":1,"a":{"y":true,"b":false}})")),
            R"({"z": 1, "a": {"y": true, "b": false}})");
  const std::pair<double, const char*> floats[] = {
      {0.1, "0.1"}, {1.0, "1.0"}, {100.0, "100.0"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"},
      {0.0001, "0.0001"}, {0.00001, "1e-05"}, {123456789.123, "123456789.123"}, {-2.5, "-2.5"},
      {1.5e300, "1.5e+300"}, {5e-324, "5e-324"}, {0.0, "0.0"}, {-0.0, "-0.0"},
      {1.0 / 3.0, "0.3333333333333333"}, {9007199254740992.0, "9007199254740992.0"},
      {123e-20, "1.23e-18"}};
  for (const auto& [v, s] : floats) EXPECT_EQ(py_float_repr(v), s) << s;
  EXPECT_EQ(py_json_dumps(ChatJson(-7)), "-7");
  EXPECT_EQ(py_json_dumps(ChatJson(18446744073709551615ULL)), "18446744073709551615");
  // Escaping split strings piecewise equals escaping the whole.
  const std::string s = "q\"\\\n\x02 ü";
  for (size_t k = 0; k <= s.size(); ++k)
    EXPECT_EQ(json_escape_body(s.substr(0, k)) + json_escape_body(s.substr(k)), json_escape_body(s));
}

TEST(ChatTools, RequestToolsWithoutSystemInsertEmptySystem) {
  ChatJson req = ChatJson::parse(R"({"messages":[{"role":"user","content":"Weather?"}]})");
  req["tools"] = ChatJson::array({ChatJson::parse(kWeatherTool)});
  auto r = encode_chat_request(req, {});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->encoded.prompt,
            BOS + SYS + "\n\n" + render_tools_block(ChatFamily::kV41, kWeatherSchema) + USR +
                "Weather?" + AST + ETH);
  EXPECT_EQ(r->parse_options.thinking_mode, ThinkingMode::kChat);
  // tool_choice "none" leaves the tools out.
  req["tool_choice"] = "none";
  auto none = encode_chat_request(req, {});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->encoded.prompt, BOS + USR + "Weather?" + AST + ETH);
}

// Members of the wrong type where the encoder looks for strings ("type" of content parts and
// tool results, "role" of the first message) give an error or a rendering, never an exception
// (nlohmann's value(key, "") throws on a non-string member).
TEST(ChatTools, WrongTypedMembersNeverThrow) {
  for (const char* body : {
           R"({"messages":[{"role":"user","content":[{"type":5,"text":"x"},{"type":"text","text":"y"}]}]})",
           R"({"messages":[{"role":"user","content_blocks":[{"type":["tool_result"]},{"type":"text","text":"t"}]}]})",
           R"({"messages":[{"role":"user","content_blocks":[{"type":"tool_result","tool_use_id":1,
               "content":[{"type":{"k":1}},{"type":"text","text":"r"}]},{"type":"tool_result","content":"s"}]}]})",
           R"({"messages":[{"role":7,"content":"hi"}],"tools":[]})",
           R"({"messages":[{"role":{"x":1},"content":"hi"}],"response_format":{"type":"json_object"}})",
           R"({"messages":["not an object"],"response_format":{"type":"json_object"}})"}) {
    const ChatJson req = ChatJson::parse(body);
    EXPECT_NO_THROW({ auto r = encode_chat_request(req, {}); (void)r; }) << body;
  }
}

TEST(ChatTools, RequestToolsJoinExistingSystemAndKeepThinking) {
  ChatJson req = ChatJson::parse(R"({"messages":[{"role":"system","content":"Be brief."},
      {"role":"user","content":"u1"},{"role":"assistant","reasoning_content":"r1","content":"c1"},
      {"role":"user","content":"u2"}], "thinking":{"type":"enabled"}, "reasoning_effort":"low",
      "response_format":{"type":"json_object"}})");
  req["tools"] = ChatJson::array({ChatJson::parse(kWeatherTool)});
  auto r = encode_chat_request(req, {});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // Tools present -> drop_thinking is off: history reasoning stays and every turn opens <think>.
  EXPECT_EQ(r->encoded.prompt,
            BOS + SYS +
                "Reasoning Effort: 25 (range 1-100, the higher the value, the more thorough the "
                "reasoning)\n\n" +
                "Be brief.\n\n" + render_tools_block(ChatFamily::kV41, kWeatherSchema) +
                "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to "
                "reply:\n{\"type\": \"json_object\"}" +
                USR + "u1" + AST + TH + "r1" + ETH + "c1" + EOS + USR + "u2" + AST + TH);
  EXPECT_EQ(r->parse_options.thinking_mode, ThinkingMode::kThinking);
}

TEST(ChatTools, RequestThinkingSwitches) {
  auto mode = [](const char* extra) {
    ChatJson req = ChatJson::parse(std::string(R"({"messages":[{"role":"user","content":"x"}])") +
                                   extra + "}");
    ChatRequestOptions o;
    auto r = encode_chat_request(req, o);
    EXPECT_TRUE(r.ok()) << extra << " " << r.status().to_string();
    return r.ok() ? r->chat_options.thinking_mode : ThinkingMode::kChat;
  };
  EXPECT_EQ(mode(""), ThinkingMode::kChat);
  EXPECT_EQ(mode(R"(,"thinking":{"type":"enabled"})"), ThinkingMode::kThinking);
  EXPECT_EQ(mode(R"(,"thinking":true)"), ThinkingMode::kThinking);
  EXPECT_EQ(mode(R"(,"chat_template_kwargs":{"enable_thinking":true})"), ThinkingMode::kThinking);
  EXPECT_EQ(mode(R"(,"chat_template_kwargs":{"thinking":false})"), ThinkingMode::kChat);
  EXPECT_EQ(mode(R"(,"reasoning_effort":"none")"), ThinkingMode::kChat);
  ChatRequestOptions on;
  on.thinking_by_default = true;
  auto r = encode_chat_request(
      ChatJson::parse(R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"none"})"), on);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->encoded.prompt, BOS + USR + "x" + AST + ETH);
  EXPECT_FALSE(encode_chat_request(ChatJson::parse(R"({"messages":[{"role":"user","content":"x"}],
      "thinking":{"type":"enabled"},"reasoning_effort":"none"})"), {}).ok());
  EXPECT_FALSE(encode_chat_request(ChatJson::parse(R"({"messages":[]})"), {}).ok());
  EXPECT_FALSE(encode_chat_request(ChatJson::parse(R"({"messages":[{"role":"user","content":"x"}],
      "thinking":"yes"})"), {}).ok());
}

// Arguments of every JSON type; expected text written by hand from the §7.3 rules.
const char* kAllTypesArgs =
    R"({"s":"he said \"hi\"\nok","i":-3,"f":1.5,"e":1e-07,"big":1e16,"b":true,"n":null,)"
    R"("a":[1,"x",{"k":false}],"o":{"z":1,"é":"ü"},"u":"日本語","empty":""})";
const std::string kAllTypesDsmlV41 =
    "<｜DSML｜ parameter name=\"s\" string=\"true\">he said \"hi\"\nok</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"i\" string=\"false\">-3</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"f\" string=\"false\">1.5</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"e\" string=\"false\">1e-07</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"big\" string=\"false\">1e+16</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"b\" string=\"false\">true</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"n\" string=\"false\">null</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"a\" string=\"false\">[1, \"x\", {\"k\": false}]</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"o\" string=\"false\">{\"z\": 1, \"é\": \"ü\"}</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"u\" string=\"true\">日本語</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"empty\" string=\"true\"></｜DSML｜ parameter>";

ChatJson two_call_conversation(const ChatJson& args_a) {
  ChatJson msgs = ChatJson::parse(R"([{"role":"user","content":"go"},
      {"role":"assistant","content":"Calling.","tool_calls":[
        {"id":"id_a","type":"function","function":{"name":"alpha","arguments":null}},
        {"id":"id_b","type":"function","function":{"name":"beta","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"id_b","content":"B-result"},
      {"role":"tool","tool_call_id":"id_a","content":[{"type":"text","text":"A1"},{"type":"text","text":"A2"}]}])");
  msgs[1]["tool_calls"][0]["function"]["arguments"] = args_a;
  return msgs;
}

TEST(ChatTools, MultipleCallsAllTypesAndReorderedResultsV41) {
  const std::string args = kAllTypesArgs;
  for (const ChatJson& a : {ChatJson(args), ChatJson::parse(args)}) {  // string or object
    ChatOptions o;
    auto r = encode_messages(two_call_conversation(a), o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->prompt,
              BOS + USR + "go" + AST + ETH + "Calling.\n\n<｜DSML｜ calls>\n" +
                  "<｜DSML｜ invoke name=\"alpha\">\n" + kAllTypesDsmlV41 + "\n</｜DSML｜ invoke>\n" +
                  "<｜DSML｜ invoke name=\"beta\">\n\n</｜DSML｜ invoke>\n</｜DSML｜ calls>" + EOS +
                  // results re-ordered to the call order (alpha first), joined by a blank line
                  USR + "<tool_result>A1\n\nA2</tool_result>\n\n<tool_result>B-result</tool_result>" +
                  AST + ETH);
  }
}

TEST(ChatTools, V4TagsWithoutSpaceAndArgumentWrapping) {
  ChatOptions o;
  o.family = ChatFamily::kV4;
  auto r = encode_messages(two_call_conversation("not json"), o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_NE(r->prompt.find("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"alpha\">\n"
                           "<｜DSML｜parameter name=\"arguments\" string=\"true\">not json"
                           "</｜DSML｜parameter>\n</｜DSML｜invoke>\n"),
            std::string::npos)
      << r->prompt;
  EXPECT_EQ(r->prompt.find("｜DSML｜ "), std::string::npos);
  EXPECT_EQ(r->prompt.find(std::string(kSystem)), std::string::npos);
  // V4.1 rejects what V4 wraps.
  for (const ChatJson bad : {ChatJson("not json"), ChatJson("[1,2]"), ChatJson(7)}) {
    auto e = encode_messages(two_call_conversation(bad), ChatOptions{});
    ASSERT_FALSE(e.ok()) << bad.dump();
    EXPECT_NE(e.status().message().find("messages[1].tool_calls[0].function.arguments"),
              std::string::npos)
        << e.status().message();
  }
}

TEST(ChatTools, ToolResultsMergeWithFollowingUserText) {
  ChatJson msgs = ChatJson::parse(R"([{"role":"user","content":"q"},
      {"role":"assistant","content":"","tool_calls":[{"id":"t1","type":"function",
        "function":{"name":"f","arguments":"{\"x\":1}"}}]},
      {"role":"tool","tool_call_id":"t1","content":"R"},{"role":"user","content":"and then?"}])");
  ChatOptions o;
  o.thinking_mode = ThinkingMode::kThinking;
  auto r = encode_messages(msgs, o);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->prompt.find(USR + "<tool_result>R</tool_result>\n\nand then?" + AST + TH),
            std::string::npos)
      << r->prompt;
  // Without tools in the request drop_thinking stays on: the tool-calling turn (before the last
  // user message) has no thinking part.
  EXPECT_NE(r->prompt.find(USR + "q" + AST + ETH + "\n\n<｜DSML｜ calls>"), std::string::npos)
      << r->prompt;
}

TEST(ChatTools, V4MaxEffortParagraph) {
  const ChatJson msgs = ChatJson::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"u"}])");
  ChatOptions o;
  o.family = ChatFamily::kV4;
  o.thinking_mode = ThinkingMode::kThinking;
  o.reasoning_effort = "max";
  auto r = encode_messages(msgs, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt, BOS + std::string(v4_max_effort_text()) + "S" + USR + "u" + AST + TH);
  o.reasoning_effort = "high";
  EXPECT_EQ(encode_messages(msgs, o)->prompt, BOS + "S" + USR + "u" + AST + TH);
  o.reasoning_effort = 50;
  EXPECT_FALSE(encode_messages(msgs, o).ok());
  o.reasoning_effort = "low";
  EXPECT_FALSE(encode_messages(msgs, o).ok());
}

}  // namespace
}  // namespace flashseek::tok
