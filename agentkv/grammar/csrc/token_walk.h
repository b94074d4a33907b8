/* The token walk's data (see token_walk.c and mask_cache.c). */

#ifndef AGENTKV_TOKEN_WALK_H
#define AGENTKV_TOKEN_WALK_H

#include <stdint.h>

typedef struct {
    const int32_t *trans;     /* [n_states * 256], -1 = no transition */
    const uint8_t *fork;      /* accepts or calls: needs expanding */
    const uint8_t *accept;
    const uint8_t *has_bytes;
    const uint8_t *tail;      /* a return state with nothing after it: a call from there replaces the frame */
    const int32_t *text_reach; /* characters of any plain text that surely survive from the state */
    const uint64_t *class_bytes; /* [n_states][4]: a class of bytes all leading one way (a 256-bit set) */
    const int32_t *class_reach;  /* how many characters of any text of that class surely survive from the state */
    const uint8_t *class_wide;   /* the class also takes every wide character past ASCII (trie.py's WIDE_PHASES) */
    const int32_t *call_off;  /* [n_states + 1]: the state's calls are call_rule/call_ret[call_off[s]:call_off[s+1]] */
    const int32_t *call_rule;
    const int32_t *call_ret;
    const int32_t *starts;    /* rule -> its start state */
    int32_t n_states;
    int32_t max_depth;        /* a stack this long pushes no more (compiled.py's MAX_STACK_DEPTH) */
    int32_t variable_rule;    /* the rule whose start differs between grammars sharing these states (a
                                 composed grammar's rule of parts); -1: none */
} Grammar;

typedef struct {
    const uint8_t *byte;       /* [n_nodes] */
    const int32_t *next;       /* the node after this one's subtree */
    const int32_t *depth;      /* bytes read at this node, its own included (1 for the root's children) */
    const int32_t *tok;        /* [n_nodes + 1] the first sorted token of the subtree (tok[n_nodes] = n_tokens) */
    const int32_t *n_end;      /* tokens ending at this node (the first of the subtree's) */
    const int32_t *text_chars; /* the most characters of plain text a token below reads past here; -1: not all plain */
    const int32_t *root_chars; /* the same from the tokens' first byte; -1 unless the path is plain too */
    const uint32_t *plain_masks; /* [max_len + 1][words]: the tokens that are plain text of at most k characters */
    const uint64_t *below_bytes; /* [n_nodes][4]: the bytes the tokens below read past the node */
    const int32_t *depth_below;  /* the most bytes a token below reads past the node */
    const uint8_t *wide_below;   /* every token below reads wide text past the node (trie.py's WIDE_PHASES) */
    const int32_t *sorted_ids; /* [n_tokens] token ids in byte order */
    const int32_t *root_child; /* [256]: the root's child for each byte (-1: none) */
    int32_t n_nodes;
    int32_t max_len;
    int32_t words;
} Trie;

int agentkv_token_walk(const Grammar *g, const Trie *t, const int32_t *stack, int32_t stack_len, int32_t relative,
                       const int32_t *starts, int32_t n_starts, uint32_t *allowed, int32_t *below,
                       int64_t *n_below, int32_t *depth, int32_t *variable);

#endif
