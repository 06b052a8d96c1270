/**
 * Does a request fit the cluster at all? The submit dialogs ask as the user types, so a job
 * no node could ever hold is refused with what to ask instead before it is sent (the server
 * would keep it waiting, or refuse it, only after the dialog closed).
 *
 * Pure: the nodes are passed in. Capacity is what a node has, not what is free now: a job
 * that fits once others end may wait, and the queue says for what.
 */
import { INode } from './types';

/** The part of a request the cluster's shape decides. */
export interface IFitRequest {
  gpus: number;
  /** GPU memory per GPU in GB; null for whole GPUs. */
  gpuMemGb: number | null;
  /** Only GPUs of this model; null for any. */
  gpuModel: string | null;
}

/** `8 GPUs`, `1 GPU`. */
function gpuWord(n: number): string {
  return `${n} GPU${n === 1 ? '' : 's'}`;
}

/**
 * Why no node can ever hold the request, in words with what to ask instead; null when one
 * can (or when the cluster is not known yet: the server then decides).
 */
export function fitProblem(request: IFitRequest, nodes: readonly INode[] | null): string | null {
  if (!nodes || nodes.length === 0) {
    return null;
  }
  const model = request.gpuModel;
  const ofModel = (n: INode) => n.gpus.filter(g => model === null || g.model === model);
  const what = model ? `${model} ` : '';
  if (request.gpuMemGb !== null && request.gpuMemGb > 0) {
    const gpus = nodes.flatMap(ofModel);
    const most = Math.max(0, ...gpus.map(g => g.mem_total_gb));
    if (gpus.length && request.gpuMemGb > most) {
      return (
        `no ${what}GPU has ${request.gpuMemGb} GB of memory; the largest have ` +
        `${Math.floor(most)} GB: ask for at most that, or leave it empty for whole GPUs`
      );
    }
  }
  if (request.gpus < 1) {
    return null;
  }
  const fits = (n: INode) =>
    ofModel(n).filter(g => request.gpuMemGb === null || g.mem_total_gb >= request.gpuMemGb).length;
  let best: INode | null = null;
  for (const n of nodes) {
    if (best === null || fits(n) > fits(best)) {
      best = n;
    }
  }
  const largest = best ? fits(best) : 0;
  if (request.gpus <= largest) {
    return null;
  }
  if (largest === 0) {
    return `no node has ${what}GPUs; choose another GPU model, or any`;
  }
  return (
    `no node has ${gpuWord(request.gpus).replace('GPU', `${what}GPU`)}; the largest has ` +
    `${largest} (${best!.name}): ask for at most ${largest}, or split the work into ` +
    'several jobs'
  );
}
