import re,sys
# hot instruction count of rr_quantize_rot256's loop: the loop minus the encode path and the inf path
lines=[l for l in open(sys.argv[1])]
ins=[]
for l in lines:
    m=re.match(r'\s+/\*([0-9a-f]+)\*/\s+(.*?);',l)
    if m: ins.append((int(m.group(1),16),m.group(2).strip()))
back=[(a,int(re.search(r'BRA (0x[0-9a-f]+)',t).group(1),16)) for a,t in ins if re.search(r'BRA (0x[0-9a-f]+)',t) and int(re.search(r'BRA (0x[0-9a-f]+)',t).group(1),16)<a]
end,start=max(back,key=lambda x:x[0]-x[1])
cold=[]
for i,(a,t) in enumerate(ins):
    if not (start<=a<=end): continue
    if 'VOTE.ANY' in t:
        a2,t2=ins[i+1]; tgt=int(re.search(r'BRA (0x[0-9a-f]+)',t2).group(1),16); cold.append((a2+16,tgt))
    m=re.search(r'BRA P\d, (0x[0-9a-f]+)',t)
    if m:
        tgt=int(m.group(1),16)
        # encode path: after this branch up to the last unconditional BRA before tgt
        prev=[x for x,y in ins if a<x<tgt and re.match(r'BRA 0x',y)]
        cold.append((a+16,max(prev)+16))
from collections import Counter
c=Counter()
for a,t in ins:
    if start<=a<=end and not any(x<=a<y for x,y in cold):
        op=re.sub(r'^@!?U?P\w+\s+','',t).split()[0].split('.')[0]; c[op]+=1
print('loop',hex(start),hex(end),'cold',[(hex(x),hex(y)) for x,y in cold],'hot',sum(c.values()))
print(sorted(c.items(),key=lambda x:-x[1]))
