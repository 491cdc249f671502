/* models.c — mlp, cnn, resnet20/18/50 (CIFAR variants) with torchvision's module names. */
#include "models.h"
#include "rng.h"
#include "util.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

/* conv → bn (→ relu) */
static int conv_bn(tq_graph *g, int x, int k, int r, int stride, int pad, const char *cname,
                   const char *bname, int relu) {
    int y = tq_conv(g, x, k, r, stride, pad, 0, cname);
    y = tq_bn(g, y, bname);
    return relu ? tq_relu(g, y) : y;
}

static int downsample(tq_graph *g, int x, int out, int stride) {
    tq_graph_push_scope(g, "downsample");
    int y = tq_conv(g, x, out, 1, stride, 0, 0, "0");
    y = tq_bn(g, y, "1");
    tq_graph_pop_scope(g);
    return y;
}

static int basic_block(tq_graph *g, int x, int planes, int stride) {
    int in = g->tensors[x].shape.c;
    int y = conv_bn(g, x, planes, 3, stride, 1, "conv1", "bn1", 1);
    y = conv_bn(g, y, planes, 3, 1, 1, "conv2", "bn2", 0);
    int sc = (stride != 1 || in != planes) ? downsample(g, x, planes, stride) : x;
    return tq_relu(g, tq_add(g, y, sc));
}

static int bottleneck(tq_graph *g, int x, int planes, int stride) {
    int in = g->tensors[x].shape.c, out = planes * 4;
    int y = conv_bn(g, x, planes, 1, 1, 0, "conv1", "bn1", 1);
    y = conv_bn(g, y, planes, 3, stride, 1, "conv2", "bn2", 1);
    y = conv_bn(g, y, out, 1, 1, 0, "conv3", "bn3", 0);
    int sc = (stride != 1 || in != out) ? downsample(g, x, out, stride) : x;
    return tq_relu(g, tq_add(g, y, sc));
}

static int resnet(tq_graph *g, int x, int nstages, const int *blocks, const int *widths,
                  int bottle) {
    x = conv_bn(g, x, widths[0], 3, 1, 1, "conv1", "bn1", 1);
    for (int s = 0; s < nstages; s++) {
        for (int b = 0; b < blocks[s]; b++) {
            tq_graph_push_scope(g, "layer%d", s + 1);
            tq_graph_push_scope(g, "%d", b);
            int stride = (b == 0 && s > 0) ? 2 : 1;
            x = bottle ? bottleneck(g, x, widths[s], stride) : basic_block(g, x, widths[s], stride);
            tq_graph_pop_scope(g);
            tq_graph_pop_scope(g);
        }
    }
    return tq_avgpool(g, x);
}

tq_graph *tq_model_build(tq_model_kind m, int batch, int h, int w, int c, int classes,
                         tq_dtype dt, char *err, size_t errlen) {
    if (m == TQ_MODEL_CNN && (h % 4 || w % 4)) {
        snprintf(err, errlen, "model cnn needs input height and width divisible by 4 (got %dx%d)", h, w);
        return NULL;
    }
    if (h < 4 || w < 4) {
        snprintf(err, errlen, "input %dx%d is too small for model %s", h, w, tq_model_name(m));
        return NULL;
    }
    tq_graph *g = tq_graph_new(batch, h, w, c, dt);
    int x = g->input;
    switch (m) {
    case TQ_MODEL_MLP:
        x = tq_relu(g, tq_linear(g, x, 512, "fc1"));
        x = tq_relu(g, tq_linear(g, x, 256, "fc2"));
        x = tq_linear(g, x, classes, "fc3");
        break;
    case TQ_MODEL_CNN:
        x = tq_maxpool2(g, tq_relu(g, tq_conv(g, x, 32, 3, 1, 1, 1, "conv1")));
        x = tq_maxpool2(g, tq_relu(g, tq_conv(g, x, 64, 3, 1, 1, 1, "conv2")));
        x = tq_relu(g, tq_linear(g, x, 128, "fc1"));
        x = tq_linear(g, x, classes, "fc2");
        break;
    case TQ_MODEL_RESNET20: {
        static const int b[] = {3, 3, 3}, wd[] = {16, 32, 64};
        x = tq_linear(g, resnet(g, x, 3, b, wd, 0), classes, "fc");
        break;
    }
    case TQ_MODEL_RESNET18: {
        static const int b[] = {2, 2, 2, 2}, wd[] = {64, 128, 256, 512};
        x = tq_linear(g, resnet(g, x, 4, b, wd, 0), classes, "fc");
        break;
    }
    case TQ_MODEL_RESNET50: {
        static const int b[] = {3, 4, 6, 3}, wd[] = {64, 128, 256, 512};
        x = tq_linear(g, resnet(g, x, 4, b, wd, 1), classes, "fc");
        break;
    }
    }
    tq_graph_loss(g, x, classes);
    return g;
}

/* PyTorch's defaults: Linear and Conv weights kaiming_uniform(a=√5) = U(±1/√fan_in), biases
 * U(±1/√fan_in); torchvision's ResNet: conv weights kaiming_normal(fan_out, relu), BN 1/0. */
void tq_model_init(const tq_graph *g, uint64_t seed, float *params, float *buffers, int64_t *counts) {
    int resnet_convs = 0;
    for (int i = 0; i < g->nnodes; i++) if (g->nodes[i].op == TQ_OP_BN) resnet_convs = 1;
    for (int pi = 0; pi < g->nparams; pi++) {
        const tq_param *p = &g->params[pi];
        if (p->where == TQ_PB_COUNT) { counts[p->offset] = 0; continue; }
        float *dst = (p->where == TQ_PB_PARAM ? params : buffers) + p->offset;
        tq_rng r = tq_rng_make(seed, TQ_RNG_INIT, (uint64_t)pi);
        int kind = (int)p->init_kind;
        double bound = 1.0 / sqrt((double)p->fan_in);
        double std = sqrt(2.0 / (double)p->fan_out);
        for (size_t i = 0; i < p->numel; i++) {
            double v;
            switch (kind) {
            case TQ_INIT_CONV:
                v = resnet_convs ? std * tq_rng_normal(&r) : bound * (2 * tq_rng_uniform(&r) - 1);
                break;
            case TQ_INIT_BIAS: case TQ_INIT_LINEAR: v = bound * (2 * tq_rng_uniform(&r) - 1); break;
            case TQ_INIT_ONES: v = 1; break;
            default: v = 0; break;
            }
            dst[i] = (float)v;
        }
    }
}
