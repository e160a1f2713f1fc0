"""Realistic wrong answers for solutions/11_engine.ipynb; each must lose points (see docs/COURSE_PIPELINE.md)."""

RUNNING = '''    i = 0
    while i < len(engine.running) and budget > 0:
        s = engine.running[i]
        n = tokens_to_feed(s, budget)
        need = cache.blocks_needed(s.req.rid, n)
        while need > cache.pool.num_free - claimed and engine.running[-1] is not s:
            preempt(engine, engine.running[-1])  # the newest has done the least work
            preempted += 1
        if need > cache.pool.num_free - claimed:  # s is the newest itself: it waits
            preempt(engine, s)
            preempted += 1
            break
        plan.append((s, n))
        claimed += need
        budget -= n
        i += 1
'''
ADMIT_HEAD = "    limit = engine.max_running if engine.max_running is not None else len(engine.running) + len(engine.waiting)\n"
FINISH = '"""s produced its last token: free its blocks and take it off the running list."""\n    ### BEGIN SOLUTION\n'

WRONG = {
    # Every running request may take the whole budget: a step feeds far more than token_budget tokens.
    "budget_overrun": [("schedule", "        n = tokens_to_feed(s, budget)\n        need",
                        "        n = tokens_to_feed(s, engine.budget)\n        need")],
    # New prompts are admitted and prefilled before the running requests decode: decodes stall behind prefills.
    "prefill_before_decodes": [
        ("schedule", RUNNING + ADMIT_HEAD, "    running_now = list(engine.running)\n" + ADMIT_HEAD),
        ("schedule", "    ### END SOLUTION\n    return plan, preempted",
         RUNNING.replace("len(engine.running)", "len(running_now)").replace("engine.running[i]", "running_now[i]")
         + "    ### END SOLUTION\n    return plan, preempted"),
    ],
    # The oldest running request is preempted (it has done the most work, which is thrown away).
    "preempting_the_oldest": [("schedule", "preempt(engine, engine.running[-1])  # the newest has done the least work",
                               "preempt(engine, next(r for r in engine.running if r is not s))")],
    # finish frees the sequence through the cache as well as through the engine: a double free.
    "double_free": [("preempt_finish", FINISH + "    engine.free(s)\n",
                     FINISH + "    engine.free(s)\n    engine.cache.free_sequence(s.req.rid)\n")],
    # finish takes the request off the running list but never gives its blocks back.
    "blocks_leaked_on_finish": [("preempt_finish", FINISH + "    engine.free(s)\n", FINISH)],
    # Admission checks the blocks of the prompt only: no room kept for the running requests to grow into.
    "admitting_without_the_watermark": [("schedule", "        if engine.running:\n            whole += engine.watermark\n", "")],
    # Admission on the first chunk alone: requests with long prompts are admitted and preempted again later.
    "admitting_on_the_first_chunk": [("schedule", "whole = cache.blocks_needed(s.req.rid, len(s.tokens) - cached)",
                                      "whole = cache.blocks_needed(s.req.rid, min(len(s.tokens) - cached, budget))")],
    # A preempted request keeps its computed count: after readmission it feeds nothing for tokens it lost.
    "preempted_not_recomputed": [("preempt_finish", "    s.computed = 0  # its K/V are gone: prompt + output are fed again on readmission\n", "")],
    # A preempted request goes to the back of the queue: requests that arrived later overtake it.
    "preempted_to_the_back": [("preempt_finish", "engine.waiting.appendleft(s)", "engine.waiting.append(s)")],
    # Eviction ignores the locks: blocks a running request reads are freed under it.
    "evicting_a_locked_node": [("radix_tree", "not x.children and x.lock_ref == 0:", "not x.children:")],
    # The split keeps one token too few below: the tokens after the cut lose their first one.
    "split_off_by_one": [("radix_tree", "node.key, node.value, node.parent = node.key[n:], node.value[n:], upper",
                          "node.key, node.value, node.parent = node.key[n + 1:], node.value[n + 1:], upper")],
    # The common prefix is not rounded down to whole pages: a match ends inside a block.
    "match_not_aligned_to_the_page_size": [("radix_tree", "        return n - n % self.page_size\n", "        return n\n")],
    # Only the matched node is locked, not its ancestors: an unlocked parent can be evicted later.
    "lock_only_the_node": [("radix_tree",
                            "        while node is not self.root:\n            if node.lock_ref == 0:\n"
                            "                self.evictable_size -= len(node.key)\n            node.lock_ref += 1\n"
                            "            node = node.parent\n",
                            "        if node is not self.root:\n            if node.lock_ref == 0:\n"
                            "                self.evictable_size -= len(node.key)\n            node.lock_ref += 1\n")],
    # The most recently used leaf is evicted first.
    "evicting_the_newest_leaf": [("radix_tree", "leaf = min(leaves, key=lambda x: x.last_access)",
                                  "leaf = max(leaves, key=lambda x: x.last_access)")],
    # match reads the slots of a partly matched edge without splitting it: the node returned is too deep.
    "match_without_split": [("radix_tree",
                             "            if n < len(child.key):\n                child = self.split(child, n)\n"
                             "            child.last_access = self.clock\n            slots += child.value\n",
                             "            child.last_access = self.clock\n            slots += child.value[:n]\n")],
    # A new leaf is counted in size but not as evictable: the pool thinks fewer blocks are free than there are.
    "new_leaf_not_evictable": [("radix_tree", "                self.evictable_size += len(leaf.key)\n                break\n",
                                "                break\n")],
    # The chunk is computed from the prompt only: after a preemption the output so far is never recomputed.
    "chunk_from_prompt_only": [("tokens_to_feed", "return min(len(s.tokens) - s.computed, budget)",
                                "return min(len(s.req.prompt) - s.computed, budget) if s.computed < len(s.req.prompt) else 1")],
}
