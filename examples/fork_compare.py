"""Fork and compare, in the DSL: one prompt, three drafts written in parallel branches, then the
model picks the best. `fork` prefills the shared prompt once; every branch starts from its cached KV.

    agentkv run examples/fork_compare.py --arg topic="a rainy day"     (or: python examples/fork_compare.py)
"""

import agentkv as ak


@ak.function
def fork_compare(s, topic: str, drafts: int = 3):
    s += ak.system("You are a poet who writes one-line poems.")
    s += ak.user(f"Write a one-line poem about {topic}.")
    branches = s.fork(drafts)
    for i, branch in enumerate(branches):
        branch += ak.assistant(ak.gen("poem", max_tokens=32, temperature=0.9, seed=i, stop="\n"))
    poems = branches.join()["poem"]
    s += ak.assistant(poems[0])
    s += ak.user("Here are other drafts:\n" + "\n".join(f"{i + 1}. {p}" for i, p in enumerate(poems))
                 + "\nWhich draft is best? Answer with its number.")
    s += ak.assistant(ak.select("best", [str(i + 1) for i in range(drafts)]))
    s.branches = branches


def main(topic: str = "the sea at night", drafts: str = "3") -> str:
    state = fork_compare.run(topic=topic, drafts=int(drafts))
    for i, branch in enumerate(state.branches):
        u = branch.usage[0]
        print(f"draft {i + 1}: {branch['poem']!r}  ({u.cached_tokens} of {u.prompt_tokens} prompt tokens cached)")
    best = int(state["best"])
    return f"best: draft {best}: {state.branches[best - 1]['poem']}"


if __name__ == "__main__":
    print(main())
