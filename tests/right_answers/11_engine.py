"""Correct answers for notebooks/11_engine.ipynb written differently from the solution; each must get full marks.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text), as in tests/wrong_answers/.
"""

RIGHT = {
    # Conditional expressions, a list insert at the front, a filtered running list; a for loop with enumerate for the
    # common prefix and the leaves collected recursively.
    "expressions_and_recursion": [
        ("tokens_to_feed", "    return min(len(s.tokens) - s.computed, budget)\n",
         "    left = len(s.req.prompt) + len(s.output) - s.computed\n    return left if left < budget else budget\n"),
        ("preempt_finish", "    engine.waiting.appendleft(s)\n", "    engine.waiting.insert(0, s)\n"),
        ("preempt_finish",
         '"""s produced its last token: free its blocks and take it off the running list."""\n    ### BEGIN SOLUTION\n'
         "    engine.free(s)\n    engine.running.remove(s)\n",
         '"""s produced its last token: free its blocks and take it off the running list."""\n    ### BEGIN SOLUTION\n'
         "    engine.running[:] = [r for r in engine.running if r is not s]\n    engine.free(s)\n"),
        ("radix_tree",
         "        n = 0\n        while n < len(a) and n < len(b) and a[n] == b[n]:\n            n += 1\n"
         "        return n - n % self.page_size\n",
         "        n = len(a) if len(a) < len(b) else len(b)\n        for i, (x, y) in enumerate(zip(a, b)):\n"
         "            if x != y:\n                n = i\n                break\n"
         "        return (n // self.page_size) * self.page_size\n"),
        ("radix_tree",
         "        freed, leaves, todo = [], [], [self.root]\n        while todo:\n            x = todo.pop()\n"
         "            todo.extend(x.children.values())\n"
         "            if x is not self.root and not x.children and x.lock_ref == 0:\n                leaves.append(x)\n",
         "        def collect(x):\n            out = []\n            for c in x.children.values():\n"
         "                out += collect(c) if c.children else ([c] if c.lock_ref == 0 else [])\n            return out\n\n"
         "        freed, leaves = [], collect(self.root)\n"),
    ],
    # The scheduler written with a for loop over a snapshot of the running list and helpers; admission counts
    # free blocks left instead of blocks claimed.
    "snapshot_loop_and_free_left": [
        ("schedule",
         "    i = 0\n    while i < len(engine.running) and budget > 0:\n        s = engine.running[i]\n",
         "    for s in list(engine.running):\n        if budget == 0:\n            break\n"
         "        if not any(r is s for r in engine.running):  # preempted earlier in this step\n            continue\n"),
        ("schedule", "        claimed += need\n        budget -= n\n        i += 1\n", "        claimed += need\n        budget -= n\n"),
        ("schedule",
         "        whole = cache.blocks_needed(s.req.rid, len(s.tokens) - cached)\n        if engine.running:\n"
         "            whole += engine.watermark\n        if whole > cache.pool.num_free - claimed:\n",
         "        free_left = cache.pool.num_free - claimed - (engine.watermark if len(engine.running) > 0 else 0)\n"
         "        if cache.blocks_needed(s.req.rid, len(s.tokens) - cached) > free_left:\n"),
        ("radix_tree", "            leaf = min(leaves, key=lambda x: x.last_access)\n            leaves.remove(leaf)\n",
         "            leaves.sort(key=lambda x: -x.last_access)\n            leaf = leaves.pop()\n"),
    ],
    # match and insert share one walk written with a for-else; lock/unlock climb with a for loop over the path.
    "shared_walk": [
        ("radix_tree",
         "        self.clock += 1\n        tokens = tuple(tokens[:len(tokens) - len(tokens) % self.page_size])\n"
         "        node, slots = self.root, []\n        node.last_access = self.clock\n"
         "        while tokens and tokens[:self.page_size] in node.children:\n"
         "            child = node.children[tokens[:self.page_size]]\n            n = self.common_prefix(child.key, tokens)\n"
         "            if n < len(child.key):\n                child = self.split(child, n)\n"
         "            child.last_access = self.clock\n            slots += child.value\n"
         "            node, tokens = child, tokens[n:]\n        return slots, node\n",
         "        self.clock += 1\n        whole = len(tokens) // self.page_size * self.page_size\n"
         "        node, done, slots = self.root, 0, []\n        self.root.last_access = self.clock\n"
         "        while done < whole:\n            child = node.children.get(tuple(tokens[done:done + self.page_size]))\n"
         "            if child is None:\n                break\n"
         "            n = self.common_prefix(child.key, tuple(tokens[done:whole]))\n"
         "            if n != len(child.key):\n                child = self.split(child, n)\n"
         "            child.last_access = self.clock\n            slots.extend(child.value)\n"
         "            node, done = child, done + n\n        return slots, node\n"),
        ("radix_tree",
         "        while node is not self.root:\n            if node.lock_ref == 0:\n"
         "                self.evictable_size -= len(node.key)\n            node.lock_ref += 1\n            node = node.parent\n",
         "        path = []\n        while node is not self.root:\n            path.append(node)\n            node = node.parent\n"
         "        for x in path:\n            self.evictable_size -= len(x.key) if x.lock_ref == 0 else 0\n"
         "            x.lock_ref += 1\n"),
    ],
}
