// The op table is assembled from one file per kernel family (op_table_<family>.cc), each
// appending its OpSpecs; op_table.cc holds the norm, activation and embedding ops and the
// order. Test and tool code only.
#pragma once

#include <vector>

#include "kernels/check/op_table.h"

namespace specd::kernels::check {

void AddAttentionOps(std::vector<OpSpec>* table);  // op_table_attention.cc
void AddRopeOps(std::vector<OpSpec>* table);       // op_table_rope.cc: rope, head_rms_norm
void AddSamplingOps(std::vector<OpSpec>* table);   // op_table_sampling.cc
void AddGemmOps(std::vector<OpSpec>* table);       // op_table_gemm.cc
void AddVerifyOps(std::vector<OpSpec>* table);     // op_table_verify.cc: speculation verification
void AddDraftOps(std::vector<OpSpec>* table);      // op_table_draft.cc: draft-vocabulary maps
void AddNsaOps(std::vector<OpSpec>* table);        // op_table_nsa.cc: NSA / SSV attention

}  // namespace specd::kernels::check
