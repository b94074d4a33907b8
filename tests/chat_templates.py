"""Chat templates and special tokens of the model families agentkv's tool formats serve, written for
the tiny test models from the families' published formats (Qwen2.5's, Qwen3's with thinking, Llama
3.1's JSON tools, Mistral v0.3's [TOOL_CALLS], Llama 3.2's pythonic tool prompt, Qwen3.5's XML calls). Whitespace
control and the branches a test does not reach are simplified; what a prompt says to the model
(markers, where tools and results go, how calls are written back) is the families' own."""

from __future__ import annotations

from dataclasses import dataclass

from tests.chat_templates_gemma import (
    FUNCTIONGEMMA,
    FUNCTIONGEMMA_SPECIALS,
    GEMMA3,
    GEMMA3_PYTHONIC,
    GEMMA3_SPECIALS,
)
from tests.chat_templates_gemma4 import GEMMA4, GEMMA4_SPECIALS
from tests.chat_templates_markers import (
    DEEPSEEK_ADDED,
    DEEPSEEK_R1_0528,
    DEEPSEEK_SPECIALS,
    DEEPSEEK_V3_ADDED,
    DEEPSEEK_V31,
    GPT_OSS,
    GPT_OSS_SPECIALS,
    GRANITE_33,
    GRANITE_SPECIALS,
    KIMI_K2,
    KIMI_SPECIALS,
    PHI4_MINI,
    PHI4_MINI_SPECIALS,
)
from tests.chat_templates_tags import (
    GLM45_NOTHINK,
    GLM_ADDED,
    GLM_SPECIALS,
    MAGISTRAL,
    MISTRAL_V11,
    MISTRAL_V11_SPECIALS,
    QWEN3_CODER,
    QWEN35_XML,
)

QWEN3 = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
{%- set index = (messages|length - 1) - loop.index0 %}
{%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- set content = message.content if message.content is string else '' %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
{%- elif message.role == "assistant" %}
{%- set reasoning_content = '' %}
{%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
{{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + content }}
{%- endif %}
{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- if (loop.first and content) or (not loop.first) %}{{- '\n' }}{%- endif %}
{%- set tool_call = tool_call.function if tool_call.function else tool_call %}
{{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
{{- tool_call.arguments if tool_call.arguments is string else tool_call.arguments | tojson }}
{{- '}\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}"""

LLAMA31 = r"""{{- bos_token }}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
{%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}
{%- else %}{%- set system_message = "" %}{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}{{- "Environment: ipython\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
{{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
{{- "Do not use variables.\n\n" }}
{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\n\n" }}{%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
{%- if messages | length != 0 %}
{%- set first_user_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}
{%- else %}{{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
{{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
{{- "Given the following functions, please respond with a JSON for a function call " }}
{{- "with its proper arguments that best answers the given prompt.\n\n" }}
{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
{{- "Do not use variables.\n\n" }}
{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\n\n" }}{%- endfor %}
{{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
{%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- elif 'tool_calls' in message %}
{%- if not message.tool_calls|length == 1 %}{{- raise_exception("This model only supports single tool-calls at once!") }}{%- endif %}
{%- set tool_call = message.tool_calls[0].function %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{{- '{"name": "' + tool_call.name + '", ' }}{{- '"parameters": ' }}{{- tool_call.arguments | tojson }}{{- "}" }}
{{- "<|eot_id|>" }}
{%- elif message.role == "tool" or message.role == "ipython" %}
{{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
{{- message.content }}
{{- "<|eot_id|>" }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"""

MISTRAL_V3 = r"""{%- if messages[0]["role"] == "system" %}
{%- set system_message = messages[0]["content"] %}{%- set loop_messages = messages[1:] %}
{%- else %}{%- set loop_messages = messages %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}
{{- bos_token }}
{%- for message in loop_messages %}
{%- if message["role"] == "user" %}
{%- if tools is not none and (message == user_messages[-1]) %}
{{- "[AVAILABLE_TOOLS] [" }}
{%- for tool in tools %}
{%- set tool = tool.function %}
{{- '{"type": "function", "function": {' }}
{%- for key, val in tool.items() if key != "return" %}
{%- if val is string %}{{- '"' + key + '": "' + val + '"' }}{%- else %}{{- '"' + key + '": ' + val|tojson }}{%- endif %}
{%- if not loop.last %}{{- ", " }}{%- endif %}
{%- endfor %}
{{- "}}" }}
{%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" }}{%- endif %}
{%- endfor %}
{{- "[/AVAILABLE_TOOLS]" }}
{%- endif %}
{%- if loop.last and system_message is defined %}
{{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
{%- else %}
{{- "[INST] " + message["content"] + "[/INST]" }}
{%- endif %}
{%- elif message.tool_calls is defined and message.tool_calls is not none %}
{{- "[TOOL_CALLS] [" }}
{%- for tool_call in message.tool_calls %}
{%- set out = tool_call.function|tojson %}
{{- out[:-1] }}
{%- if not tool_call.id is defined or tool_call.id|length != 9 %}
{{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
{%- endif %}
{{- ', "id": "' + tool_call.id + '"}' }}
{%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" + eos_token }}{%- endif %}
{%- endfor %}
{%- elif message["role"] == "assistant" %}
{{- " " + message["content"]|trim + eos_token}}
{%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
{{- '[TOOL_RESULTS] {"content": ' + message.content|string + ", " }}
{%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
{{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
{%- endif %}
{{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
{%- else %}
{{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
{%- endif %}
{%- endfor %}"""

LLAMA32_PYTHONIC = r"""{{- bos_token }}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
{%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}
{%- else %}{%- set system_message = "You are a helpful assistant with tool calling capabilities. Only reply with a tool call if the function exists in the library provided by the user. If it doesn't exist, just reply directly in natural language." %}{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}{{- "Environment: ipython\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n\n" }}
{%- if tools is not none %}
{{- "You have access to the following functions. To call functions, please respond with a python list of the calls. " }}
{{- 'Respond in the format [func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)] ' }}
{{- "Do not use variables.\n\n" }}
{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\n\n" }}{%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
{%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- elif 'tool_calls' in message %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n[' -}}
{%- for tool_call in message.tool_calls %}
{%- set tool_call = tool_call.function if tool_call.function is defined else tool_call %}
{{- tool_call.name + '(' -}}
{%- for param in tool_call.arguments %}{{- param + '=' -}}{{- "%r" | format(tool_call.arguments[param]) -}}{% if not loop.last %}, {% endif %}{%- endfor %}
{{- ')' -}}{% if not loop.last %}, {% endif %}
{%- endfor %}
{{- ']<|eot_id|>' -}}
{%- elif message.role == "tool" or message.role == "ipython" %}
{{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
{{- message.content }}
{{- "<|eot_id|>" }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"""

# Qwen2.5's: Qwen3's without the reasoning block
QWEN25 = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}
{{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
{%- elif message.role == "assistant" %}
{{- '<|im_start|>' + message.role + '\n' + (message.content or '') }}
{%- for tool_call in message.tool_calls or [] %}
{%- set tool_call = tool_call.function if tool_call.function else tool_call %}
{{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' + tool_call.arguments | tojson + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"""

# DeepSeek-R1's templates open the block in the generation prompt: the reply starts inside it
R1_OPENED = QWEN3.replace("{{- '<|im_start|>assistant\\n' }}\n{%- if enable_thinking",
                          "{{- '<|im_start|>assistant\\n<think>\\n' }}\n{%- if enable_thinking")

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|eom_id|>", "<|python_tag|>"]


@dataclass(frozen=True)
class ChatFamily:
    """A family's template and tokens: `specials` are special tokens (the first is BOS, the third
    EOS, as the tiny models' configs say), `added` ordinary added tokens (Qwen's `<think>`), `ends`
    more tokens that end a reply (gpt-oss's `<|call|>`, in its generation config)."""

    template: str
    specials: tuple[str, ...]
    bos: str | None
    eos: str
    added: tuple[str, ...] = ()
    ends: tuple[str, ...] = ()


FAMILIES = {
    "qwen3": ChatFamily(QWEN3, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>",
                        ("<think>", "</think>", "<tool_call>", "</tool_call>")),
    "qwen2.5": ChatFamily(QWEN25, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>",
                          ("<tool_call>", "</tool_call>")),
    "glm45": ChatFamily(GLM45_NOTHINK, GLM_SPECIALS, None, "<|user|>", GLM_ADDED),
    "magistral": ChatFamily(MAGISTRAL, MISTRAL_V11_SPECIALS, "<s>", "</s>"),
    "mistral_v11": ChatFamily(MISTRAL_V11, MISTRAL_V11_SPECIALS, "<s>", "</s>"),
    "qwen3_coder": ChatFamily(QWEN3_CODER, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>",
                              ("<tool_call>", "</tool_call>")),
    "qwen3_xml": ChatFamily(QWEN35_XML, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>",
                            ("<think>", "</think>", "<tool_call>", "</tool_call>")),
    "r1": ChatFamily(R1_OPENED, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>",
                     ("<think>", "</think>", "<tool_call>", "</tool_call>")),
    "llama3": ChatFamily(LLAMA31, tuple(LLAMA3_SPECIALS), "<|begin_of_text|>", "<|eot_id|>"),
    "mistral": ChatFamily(MISTRAL_V3, ("<s>", "<unk>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                                       "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"), "<s>", "</s>"),
    "pythonic": ChatFamily(LLAMA32_PYTHONIC, tuple(LLAMA3_SPECIALS), "<|begin_of_text|>", "<|eot_id|>"),
    "kimi_k2": ChatFamily(KIMI_K2, KIMI_SPECIALS, None, "<|im_end|>"),
    "deepseek_v31": ChatFamily(DEEPSEEK_V31, DEEPSEEK_SPECIALS, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                               DEEPSEEK_ADDED),
    "deepseek_r1": ChatFamily(DEEPSEEK_R1_0528, DEEPSEEK_SPECIALS, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                              DEEPSEEK_V3_ADDED),
    "granite33": ChatFamily(GRANITE_33, GRANITE_SPECIALS, None, "<|end_of_text|>"),
    "functiongemma": ChatFamily(FUNCTIONGEMMA, FUNCTIONGEMMA_SPECIALS, "<bos>", "<end_of_turn>",
                                ends=("<start_function_response>", "<eos>")),
    "gemma3": ChatFamily(GEMMA3, GEMMA3_SPECIALS, "<bos>", "<end_of_turn>", ends=("<eos>",)),
    "gemma3_pythonic": ChatFamily(GEMMA3_PYTHONIC, GEMMA3_SPECIALS, "<bos>", "<end_of_turn>", ends=("<eos>",)),
    "gemma4": ChatFamily(GEMMA4, GEMMA4_SPECIALS, "<bos>", "<turn|>", ends=("<|tool_response>", "<eos>")),
    "phi4_mini": ChatFamily(PHI4_MINI, PHI4_MINI_SPECIALS, None, "<|endoftext|>", ends=("<|end|>",)),
    "gpt_oss": ChatFamily(GPT_OSS, GPT_OSS_SPECIALS, "<|startoftext|>", "<|return|>", ends=("<|call|>",)),
}
