/* graph.h — a model as a list of nodes in topological order, its parameters as flat buffers,
 * and the memory plan of one training micro-batch.
 *
 * Contract
 * - Build: tq_graph_new(batch, h, w, c, dt) makes the input node; builder calls append nodes
 *   and register their parameters under PyTorch's names (tq_graph_push_scope names modules);
 *   tq_graph_loss ends the graph; tq_graph_plan assigns every activation and
 *   activation-gradient an offset in one arena (greedy by size over lifetime intervals) and
 *   sizes the workspace. After planning the graph is immutable.
 * - Parameters live in one flat f32 buffer (offsets in elements, each aligned to 64), batch-norm
 *   running statistics in a second flat "buffers" buffer; num_batches_tracked is kept per
 *   batch-norm on the host.
 * - Schedule time: forward of node i at time i; the loss node (last, index L) runs its forward
 *   and backward at time L; backward of node i < L at time 2L − i.
 * - Recomputation (unless no_recompute is set before planning): the output of relu(bn(x)), or
 *   of relu(bn(x) + r) with r a kept ReLU output, whose backward readers are convolutions (and
 *   its ReLU) is not kept for the backward. The first of those convolutions' backwards
 *   regenerates it (backend bn_norm) from x and the batch statistics, which the BN backward
 *   keeps anyway, into a tensor that lives from there to the ReLU's backward: bit for bit the
 *   forward's values for one element-wise pass. In a ResNet that is the first ReLU of every
 *   block and every other block's output.
 * - Fusion (unless no_fuse): a BN whose output only feeds a ReLU, or only an add (with a
 *   tensor computed before the BN) that only feeds a ReLU, writes the ReLU's output itself in
 *   one pass (bn_fwd_train/infer's epilogue); the ReLU and the add do nothing in the forward,
 *   and the tensors between them are never allocated. In the backward the BN does theirs
 *   too (bn_bwd's relu_y and dres): it reads the ReLU output's gradient, and writes the add's
 *   other input's gradient; the gradients of the BN's and the add's outputs are never
 *   allocated. (Not when a node between the BN and the add reads that other input: its
 *   gradient's writers would change order.)
 *   A max-pool that is a ReLU's only reader takes the ReLU in, forward and backward
 *   (maxpool_fwd/bwd's relu): the ReLU node leaves the graph at planning, and neither its
 *   output nor that output's gradient is ever allocated. Both fusions are bit for bit the
 *   separate passes.
 * - The graph owns its memory (tq_graph_free). Not thread-safe; one trainer uses one graph.
 */
#ifndef TQ_GRAPH_H
#define TQ_GRAPH_H
#include <stddef.h>
#include <stdint.h>
#include "backend.h"

typedef enum { TQ_OP_INPUT, TQ_OP_CONV, TQ_OP_BN, TQ_OP_RELU, TQ_OP_ADD, TQ_OP_MAXPOOL,
               TQ_OP_AVGPOOL, TQ_OP_LINEAR, TQ_OP_LOSS } tq_op;

typedef enum { TQ_T_ACT, TQ_T_GRAD, TQ_T_STAT, TQ_T_LABELS } tq_tensor_kind;

typedef struct {
    tq_shape shape;
    tq_dtype dt;              /* storage type (TQ_T_STAT: f32; TQ_T_LABELS: int32, dt unused) */
    tq_tensor_kind kind;
    size_t bytes;             /* aligned to 256 */
    int t_begin, t_end;       /* lifetime, inclusive */
    size_t offset;            /* in the arena */
    int grad;                 /* id of this activation's gradient tensor, -1 none */
} tq_tensor;

/* How a parameter is laid out inside vs in PyTorch (for export/import). */
/* initialisers (models.c): PyTorch's defaults, torchvision's for ResNet convolutions */
enum { TQ_INIT_CONV, TQ_INIT_BIAS, TQ_INIT_LINEAR, TQ_INIT_ONES, TQ_INIT_ZEROS };

typedef enum { TQ_L_PLAIN, TQ_L_CONV_KRSC, TQ_L_LINEAR_HWC } tq_layout;
typedef enum { TQ_PB_PARAM, TQ_PB_BUFFER, TQ_PB_COUNT } tq_pbuf;

typedef struct {
    char name[112];           /* PyTorch name: layer1.0.conv1.weight */
    tq_pbuf where;            /* params, buffers, or num_batches_tracked (int64 on the host) */
    size_t offset, numel;     /* elements in its flat buffer (TQ_PB_COUNT: bn index) */
    int ndim; int64_t shape[4];   /* PyTorch shape */
    tq_layout layout;
    int lh, lw, lc;           /* TQ_L_LINEAR_HWC: the spatial shape flattened into `in` */
    float init_kind;          /* TQ_INIT_* */
    int fan_in, fan_out;
} tq_param;

typedef struct {
    tq_op op;
    int in[2], nin;           /* input tensor ids */
    int out;                  /* output tensor id */
    int stat[2];              /* bn: save_mean, save_invstd tensor ids */
    float din_beta[2];        /* 0: first gradient writer of that input, 1: add */
    int need_din[2];          /* 0 for the graph input */
    tq_conv_desc cd;          /* conv */
    int lin_in, lin_out;      /* linear */
    size_t w_off, b_off;      /* params (elements); b_off == TQ_NONE: no bias */
    size_t g_off, bt_off;     /* bn: gamma, beta offsets in params */
    size_t rm_off, rv_off;    /* bn: running mean/var offsets in buffers */
    int bn_index;
    int bwd_x;                /* conv: the tensor its backward reads as x (in[0], or a recompute) */
    int bwd_y;                /* relu: the tensor its backward reads as y (out, or a recompute) */
    int remat;                /* index in tq_graph.remats to run before this backward, -1 none */
    int fuse_out, fuse_res;   /* bn: the ReLU output it writes (-1: its own out), the add's other input */
    int fused;                /* relu/add: its forward is done by a BN's epilogue */
    int bwd_by;               /* relu/add: its backward is done by this BN's (bn_bwd's relu_y/dres), -1 */
    int bwd_relu, bwd_res;    /* bn: the ReLU node whose backward it does first, -1; the add's other input */
    float dres_beta;          /* bn: beta of that add input's gradient */
    int pool_relu;            /* maxpool: y = relu(maxpool(x)), a ReLU folded in (graph.h) */
} tq_node;

/* A recomputed activation: dst = relu(bn(x) [+ res]) with bn's saved input and statistics. */
typedef struct { int dst, bn, res; } tq_remat;

#define TQ_NONE ((size_t)-1)

typedef struct tq_graph {
    tq_dtype dt;              /* activation dtype */
    int batch, classes;
    tq_node *nodes; int nnodes, cap_nodes;
    tq_tensor *tensors; int ntensors, cap_tensors;
    tq_param *params; int nparams, cap_params;
    size_t nparam_elems, nbuffer_elems;   /* flat sizes (with alignment padding) */
    size_t nparameters;       /* number of trainable scalars (no padding) */
    int nbn;
    int input, labels;        /* tensor ids */
    char scope[8][48]; int nscope;
    int no_recompute;         /* set before tq_graph_plan: keep every ReLU(BN) output */
    int no_fuse;              /* set before tq_graph_plan: run BN, add and ReLU as separate passes */
    tq_remat *remats; int nremats, cap_remats;   /* the plan's recomputed activations */
    /* plan */
    size_t arena_bytes, workspace_bytes;
    int planned;
} tq_graph;

tq_graph *tq_graph_new(int batch, int h, int w, int c, tq_dtype dt);
void tq_graph_free(tq_graph *);
void tq_graph_push_scope(tq_graph *, const char *fmt, ...);
void tq_graph_pop_scope(tq_graph *);

/* builders: return the output tensor id */
int tq_conv(tq_graph *, int x, int k, int r, int stride, int pad, int bias, const char *name);
int tq_bn(tq_graph *, int x, const char *name);
int tq_relu(tq_graph *, int x);
int tq_add(tq_graph *, int a, int b);
int tq_maxpool2(tq_graph *, int x);
int tq_avgpool(tq_graph *, int x);
int tq_linear(tq_graph *, int x, int out, const char *name);
void tq_graph_loss(tq_graph *, int logits, int classes);

/* Assigns arena offsets and sizes the workspace with the backend's needs. */
int tq_graph_plan(tq_graph *, tq_backend *be);
/* Time step at which node i runs its backward (its forward runs at i). */
static inline int tq_bwd_time(const tq_graph *g, int i) { return 2 * (g->nnodes - 1) - i; }

#endif
